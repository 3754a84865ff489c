"""kws.config: the training runs of a config's experiments and seeds."""

import pytest

from kws.config import experiment_runs
from kws.errors import KwsError


def test_each_seed_is_a_run_and_the_default_seed_keeps_the_experiment_name():
    experiments = {"b": {"model": "m"}, "a": {"model": "m", "seeds": [2, 666, 1]}}
    assert experiment_runs(experiments, 666) == {
        "a": ("a", 666),
        "a-seed1": ("a", 1),
        "a-seed2": ("a", 2),
        "b": ("b", 666),
    }
    assert experiment_runs({"a": {"seeds": [5]}}, 666) == {"a-seed5": ("a", 5)}


def test_seeds_that_collide_are_refused_naming_the_key():
    with pytest.raises(KwsError, match="experiments.a.seeds: a seed is listed twice"):
        experiment_runs({"a": {"seeds": [1, 1]}}, 666)
    with pytest.raises(KwsError, match="seeds: the run of seed .* would be named a-seed1, which is an experiment"):
        experiment_runs({"a": {"seeds": [1]}, "a-seed1": {}}, 666)
