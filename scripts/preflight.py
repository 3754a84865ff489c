#!/usr/bin/env python
"""Check a multi-GPU training set-up before starting it (the checks train.py runs, on their own).

    python scripts/preflight.py --gpus 0,1 --nproc_per_node 2 --config config/models/ds_tcn.yaml \\
        --num_workers 8 [--master_port 29500] [--ddp.dist_backend nccl]

Prints `ok:` lines and `warning:` lines; exits 1 with `error: ...` on the first failure.
"""

import argparse

from kws.errors import cli
from kws.preflight import DEFAULT_MASTER_PORT, run_preflight


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default=None, help="WeKws-style GPU ids, e.g. 0,1 (-1: CPU)")
    parser.add_argument("--nproc_per_node", type=int, default=None, help="torchrun --nproc_per_node")
    parser.add_argument("--config", default=None, help="model config (WeKws YAML)")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted config override, e.g. training_config.grad_clip=5 (repeatable)",
    )
    parser.add_argument("--num_workers", type=int, default=None, help="DataLoader workers per process")
    parser.add_argument("--threads", type=int, default=None, help="CPUs the job gets (default: affinity mask)")
    parser.add_argument("--master_addr", default="127.0.0.1", help="rendezvous host (default 127.0.0.1)")
    parser.add_argument(
        "--master_port",
        type=int,
        default=DEFAULT_MASTER_PORT,
        help=f"rendezvous port to check (default {DEFAULT_MASTER_PORT}, torchrun's)",
    )
    parser.add_argument(
        "--choose_port",
        action="store_true",
        help="when the port is taken, print a free one (last line: master_port=N) instead of failing",
    )
    parser.add_argument(
        "--ddp.dist_backend",
        dest="dist_backend",
        default="auto",
        choices=["auto", "nccl", "gloo"],
        help="distributed backend (auto: nccl with GPUs, gloo without)",
    )
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    if args.config is not None and args.override:
        from kws.config import load_model_config, parse_overrides

        args.config = load_model_config(args.config, parse_overrides(args.override))
    report = run_preflight(args, check_port_free=True, choose_port=args.choose_port)
    for line in report.ok:
        print(f"ok: {line}")
    for line in report:
        print(f"warning: {line}")
    print(f"preflight passed with {len(report)} warning(s)" if report else "preflight passed")
    if args.choose_port and report.master_port is not None:
        print(f"master_port={report.master_port}")
    return 0


if __name__ == "__main__":
    main()
