#!/usr/bin/env python3
"""Write an experiment's resolved configuration: the model config with overrides (a config WeKws's train.py
reads as it is), with the experiment entry and the pipeline settings under `kwsflow`."""

import argparse
import json

from kws.config import dump_yaml, experiment_record, load_model_config
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
    resolved = experiment_record(
        load_model_config(args.model_config, experiment.get("overrides")), experiment, json.loads(args.pipeline)
    )
    with atomic_open(args.out) as out:
        out.write(dump_yaml(resolved))


if __name__ == "__main__":
    main()
