"""Model configs in WeKws's YAML layout, with dotted-key overrides (`training_config.grad_clip: 5`)."""

import copy
from pathlib import Path

import yaml

from kws.errors import KwsError


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
# kwsflow records its CMVN settings under `cmvn`.
MODEL_KEYS = {"hidden_dim", "preprocessing", "backbone", "classifier", "activation", "input_dim", "output_dim", "cmvn"}


def check_model_keys(model_conf, source="model"):
    """A misspelt key (model.hiden_dim) would otherwise be ignored and the default trained silently."""
    unknown = sorted(set(model_conf) - MODEL_KEYS)
    if unknown:
        raise KwsError(f"{source}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(MODEL_KEYS))})")


def load_model_config(path, overrides=None):
    """A WeKws-style model config with overrides applied and the sections the pipeline needs checked."""
    conf = apply_overrides(load_yaml(path), overrides, source=str(path))
    for section in ("dataset_conf", "model", "training_config"):
        if not isinstance(conf.get(section), dict):
            raise KwsError(f"{path}: missing section {section!r}")
    check_model_keys(conf["model"], source=f"{path}: model")
    return conf


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
