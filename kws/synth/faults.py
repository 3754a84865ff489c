"""Fault injection for the tests of the synthesiser, set through the environment (not an interface).

`KWS_SYNTH_FAULTS` holds a JSON object `{"crash": {key: "once" | "always"}, "kill_worker": [key, ...]}`:
the eSpeak child crashes (SIGSEGV) on the first request of each `crash` item, once (its retry with the
fallback voice then succeeds) or always; the worker process exits on its first attempt at the chunk of
each `kill_worker` item. `mark` sets the markers the workers act on (a request's `_crash`, a chunk's
`_kill_worker`, read in kws.synth.espeak and kws.synth.pool).
"""

import json
import os

ENV = "KWS_SYNTH_FAULTS"


def mark(chunks, environ=None):
    """Mark the planned faults of `KWS_SYNTH_FAULTS` in `chunks` (none when it is unset)."""
    text = (os.environ if environ is None else environ).get(ENV)
    if not text:
        return
    faults = json.loads(text)
    crash, kill = faults.get("crash", {}), set(faults.get("kill_worker", ()))
    for chunk in chunks:
        for item in chunk["items"]:
            if item["key"] in crash:
                item["requests"][0]["_crash"] = crash[item["key"]]
            if item["key"] in kill:
                chunk["_kill_worker"] = True
