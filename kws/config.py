"""Model configs in WeKws's YAML layout, with dotted-key overrides (`training_config.grad_clip: 5`)."""

import copy
from pathlib import Path

import yaml

from kws.errors import KwsError
from kws.features import fbank_conf_of


def load_yaml(path):
    """Load a YAML mapping; a clear error naming the file (and line) when it is malformed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KwsError(f"{path}: config file not found") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise KwsError(f"{path}{line}: malformed YAML ({problem})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise KwsError(f"{path}: expected a mapping at the top level")
    return data


def apply_overrides(conf, overrides, source="overrides"):
    """Return a copy of `conf` with dotted keys set, e.g. {"model.hidden_dim": 64}."""
    result = copy.deepcopy(conf)
    for dotted, value in (overrides or {}).items():
        node = result
        parts = str(dotted).split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise KwsError(f"{source}: {dotted}: {part!r} is not a mapping in the model config")
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    return result


# Keys of a model config's `model:` section. WeKws configs also carry input_dim/output_dim/activation;
# kwsflow records its CMVN settings under `cmvn`, and the dropout before its linear output layer under
# `classifier_dropout` (WeKws ignores the key: its linear layer has no dropout, which changes nothing at
# inference). `classifier` is read for older kwsflow configs only: WeKws knows no `linear` type there.
MODEL_KEYS = {
    "hidden_dim",
    "preprocessing",
    "backbone",
    "classifier",
    "classifier_dropout",
    "activation",
    "input_dim",
    "output_dim",
    "cmvn",
}

# Every backbone key kwsflow reads, with its default; configs are written with all of them, because
# WeKws requires some that kwsflow defaults (tcn/gru num_layers; every mdtc key). mdtc's hidden_dim
# defaults to the model's.
BACKBONE_DEFAULTS = {
    "tcn": {"ds": False, "num_layers": 4, "kernel_size": 8, "dropout": 0.1},
    "mdtc": {"num_stack": 4, "stack_size": 4, "kernel_size": 5, "hidden_dim": None, "causal": True},
    "gru": {"num_layers": 2, "dropout": 0.0},
}
# WeKws's classifiers for utterance classification (speech commands): kwsflow scores per frame only.
WEKWS_CLASSIFIERS = ("global", "last", "identity")

# kwsflow's dataset defaults. WeKws HEAD (wenet's data pipeline) shuffles, sorts and applies SpecAugment
# unless told otherwise and then needs shuffle_conf/sort_conf sizes; kwsflow does none of these unless
# told, so configs are written with every switch and size spelt out: both tools then read them alike.
DEFAULT_FILTER = {"max_length": 10240, "min_length": 0}
DEFAULT_SPEC_AUG = {"num_t_mask": 1, "num_f_mask": 1, "max_t": 20, "max_f": 10}
DEFAULT_SHUFFLE_SIZE = 1500
DEFAULT_SORT_SIZE = 500
DEFAULT_BATCH_SIZE = 16


def check_model_keys(model_conf, source="model"):
    """A misspelt key (model.hiden_dim) would otherwise be ignored and the default trained silently."""
    unknown = sorted(set(model_conf) - MODEL_KEYS)
    if unknown:
        raise KwsError(f"{source}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(MODEL_KEYS))})")


def _mapping(parent, key, where):
    """parent[key] as a (new, when absent or null) mapping; a KwsError naming the key otherwise."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise KwsError(f"{where}.{key}: expected a mapping, got {value!r}")
    return value


def normalise_dataset_conf(dataset_conf, where="dataset_conf"):
    """A copy of dataset_conf in WeKws HEAD's layout with kwsflow's defaults written out."""
    conf = copy.deepcopy(dataset_conf)
    conf["fbank_conf"] = fbank_conf_of(conf, where)
    conf.pop("feature_extraction_conf", None)
    _mapping(conf, "filter_conf", where)
    for name, value in DEFAULT_FILTER.items():
        conf["filter_conf"].setdefault(name, value)
    for switch, section, defaults in (
        ("shuffle", "shuffle_conf", {"shuffle_size": DEFAULT_SHUFFLE_SIZE}),
        ("sort", "sort_conf", {"sort_size": DEFAULT_SORT_SIZE}),
        ("spec_aug", "spec_aug_conf", DEFAULT_SPEC_AUG),
    ):
        conf[switch] = bool(conf.get(switch, False))
        if conf[switch]:
            values = _mapping(conf, section, where)
            for name, value in defaults.items():
                values.setdefault(name, value)
    batch = _mapping(conf, "batch_conf", where)
    if batch.get("batch_type", "static") == "static":
        batch.setdefault("batch_size", DEFAULT_BATCH_SIZE)
    return conf


def _normalise_backbone(conf, where):
    backbone = _mapping(conf, "backbone", where)
    kind = backbone.get("type")
    if kind not in BACKBONE_DEFAULTS:
        raise KwsError(f"{where}.backbone.type: unknown backbone {kind!r} ({'|'.join(BACKBONE_DEFAULTS)})")
    if kind == "mdtc" and "stack_num" in backbone:
        if "num_stack" in backbone:
            raise KwsError(f"{where}.backbone: give stack_num or num_stack (WeKws spelling), not both")
        backbone["num_stack"] = backbone.pop("stack_num")
    unknown = sorted(set(backbone) - set(BACKBONE_DEFAULTS[kind]) - {"type"})
    if unknown:
        raise KwsError(f"{where}.backbone.{unknown[0]}: unknown key for backbone {kind!r}")
    for name, value in BACKBONE_DEFAULTS[kind].items():
        backbone.setdefault(name, conf.get("hidden_dim") if value is None else value)


def normalise_model_conf(model_conf, where="model"):
    """A copy of the `model:` section as WeKws's init_model reads it and kwsflow builds it.

    Written out: preprocessing type, every backbone key (WeKws's `num_stack`, not `stack_num`), and
    `classifier_dropout` in place of an older kwsflow `classifier: {type: linear, dropout}`.
    """
    if not isinstance(model_conf, dict):
        raise KwsError(f"{where}: expected a mapping, got {model_conf!r}")
    conf = copy.deepcopy(model_conf)
    check_model_keys(conf, where)
    prep = _mapping(conf, "preprocessing", where)
    prep["type"] = prep.get("type", "linear") or "none"  # `type: null` has always meant none

    if "backbone" in conf:  # absent: a config read for its features only (CMVN); build_model says so
        _normalise_backbone(conf, where)

    classifier = conf.pop("classifier", None)
    if classifier is not None:
        if not isinstance(classifier, dict):
            raise KwsError(f"{where}.classifier: expected a mapping, got {classifier!r}")
        ctype = classifier.get("type", "linear")
        if ctype in WEKWS_CLASSIFIERS:
            raise KwsError(
                f"{where}.classifier.type: WeKws's {ctype!r} classifier (utterance classification) is "
                f"not supported; leave model.classifier out for the per-frame linear layer"
            )
        if ctype != "linear":
            raise KwsError(f"{where}.classifier.type: unknown classifier {ctype!r} (leave model.classifier out)")
        unknown = sorted(set(classifier) - {"type", "dropout"})
        if unknown:
            raise KwsError(f"{where}.classifier.{unknown[0]}: unknown key")
        if "dropout" in classifier and "classifier_dropout" in conf:
            raise KwsError(f"{where}: give classifier_dropout or classifier.dropout, not both")
        if classifier.get("dropout"):
            conf["classifier_dropout"] = classifier["dropout"]
    return conf


def load_model_config(path, overrides=None):
    """A model config with overrides applied, checked, and normalised so that WeKws HEAD reads it too.

    Accepts WeKws's layouts (HEAD's `fbank_conf`, the older `feature_extraction_conf`) and kwsflow's
    older `classifier: {type: linear}`; returns WeKws HEAD's layout (see normalise_*).
    """
    conf = apply_overrides(load_yaml(path), overrides, source=str(path))
    for section in ("dataset_conf", "model", "training_config"):
        if not isinstance(conf.get(section), dict):
            raise KwsError(f"{path}: missing section {section!r}")
    conf["dataset_conf"] = normalise_dataset_conf(conf["dataset_conf"], f"{path}: dataset_conf")
    conf["model"] = normalise_model_conf(conf["model"], f"{path}: model")
    return conf


def set_model_dims(config, num_keywords, source="config"):
    """Record model.input_dim (the fbank dimension) and model.output_dim (the keywords), as WeKws's train.py
    does in the config.yaml it writes: its score.py and export scripts build the model from them."""
    model = config["model"]
    dims = {"input_dim": int(fbank_conf_of(config["dataset_conf"])["num_mel_bins"]), "output_dim": int(num_keywords)}
    for key, value in dims.items():
        if model.get(key, value) != value:
            raise KwsError(
                f"{source}: model.{key} is {model[key]!r} but the run needs {value} "
                f"(fbank num_mel_bins / --num_keywords); leave model.{key} out"
            )
        model[key] = value
    return config


def experiment_record(model_config, experiment, pipeline):
    """An experiment's resolved config.yaml: the model config at the top, as WeKws's --config reads it,
    and kwsflow's own settings (the experiment entry and the pipeline) under `kwsflow` (WeKws ignores it).
    """
    record = copy.deepcopy(model_config)
    record["kwsflow"] = {"experiment": experiment, "pipeline": pipeline}
    return record


def experiment_runs(experiments, default_seed):
    """Each training run of a config: {run name: (experiment, seed)}, sorted by name.

    An experiment trains once per seed of its `seeds` (default: [train.seed]). The run of train.seed
    keeps the experiment's name (and its results folder, so listing more seeds retrains nothing); every
    other seed's run is `<experiment>-seed<N>`.
    """
    runs = {}
    for name in sorted(experiments):
        seeds = experiments[name].get("seeds") or [default_seed]
        if len(set(seeds)) != len(seeds):
            raise KwsError(f"config: experiments.{name}.seeds: a seed is listed twice ({seeds})")
        for seed in seeds:
            run = name if seed == default_seed else f"{name}-seed{seed}"
            if run in runs:
                raise KwsError(
                    f"config: experiments.{name}.seeds: the run of seed {seed} would be named {run}, "
                    f"which is an experiment's name too; rename one"
                )
            runs[run] = (name, seed)
    return dict(sorted(runs.items()))


def dump_yaml(data):
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _validator_with_defaults(schema):
    """A JSON Schema validator that also fills in `default` values, as Snakemake's validate() does."""
    import jsonschema

    base = jsonschema.Draft202012Validator

    def fill_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    extended = jsonschema.validators.extend(base, {"properties": fill_defaults})
    return extended(schema)


def _describe(error):
    path = ".".join(str(part) for part in error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        where = f"{path}." if path else ""
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return f"unknown key {where}{extra[0] if extra else '?'}{hint}"
    if error.validator == "required":
        return f"{path or 'top level'}: {error.message}"
    return f"{path or 'top level'}: {error.message}"


def validate_config(config, schema_path, source="config"):
    """Validate `config` in place against a JSON Schema (YAML), filling defaults.

    Raises KwsError naming the offending key, e.g. `config/config.yaml: train.num_workers: 'two' is not
    of type 'integer'`.
    """
    schema = load_yaml(schema_path)
    validator = _validator_with_defaults(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        raise KwsError(f"{source}: {_describe(errors[0])}")
    return config


def parse_overrides(items, flag="--override"):
    """`KEY=VALUE` strings (values parsed as YAML/JSON) as {dotted key: value}, for apply_overrides."""
    result = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise KwsError(f"{flag} {item!r}: expected KEY=VALUE, e.g. training_config.grad_clip=5")
        try:
            result[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise KwsError(f"{flag} {item!r}: value is not valid YAML/JSON") from None
    return result
