#!/usr/bin/env python
"""Train a keyword-spotting model; run under torchrun for DDP (WeKws's wekws/bin/train.py arguments).

    torchrun --standalone --nnodes 1 --nproc_per_node 2 scripts/train.py --config conf/ds_tcn.yaml \
        --train_data data/train/data.list --cv_data data/dev/data.list --model_dir exp/ds_tcn \
        --num_workers 1 --num_keywords 2 --min_duration 50 --seed 666 --dict ./dict \
        --cmvn_file data/train/global_cmvn --norm_var

Without torchrun it trains in one process. See kws/trainer.py for what a run writes and how it resumes.
"""

import sys

from kws.errors import cli
from kws.trainer import main as train_main


@cli
def main(argv=None):
    return train_main(argv)


if __name__ == "__main__":
    sys.exit(main())
