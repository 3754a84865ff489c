#!/usr/bin/env python3
"""Write an experiment's resolved configuration: the pipeline settings plus the model config with overrides."""

import argparse
import json

from kws.config import dump_yaml, load_model_config
from kws.errors import cli
from kws.fileio import atomic_open


@cli
def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-config", required=True, help="WeKws-style model config YAML")
    parser.add_argument("--experiment", required=True, help="the experiment's entry of config.yaml, as JSON")
    parser.add_argument("--pipeline", required=True, help="the pipeline settings (corpus, train, ...), as JSON")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    experiment = json.loads(args.experiment)
    resolved = {
        "pipeline": json.loads(args.pipeline),
        "experiment": experiment,
        "model_config": load_model_config(args.model_config, experiment.get("overrides")),
    }
    with atomic_open(args.out) as out:
        out.write(dump_yaml(resolved))


if __name__ == "__main__":
    main()
