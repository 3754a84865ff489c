# Data preparation: the corpus (synthesised, or a real one the user downloaded), then WeKws data lists.

CORPUS_OUTPUTS = {
    "words": f"{DATA}/dict/words.txt",
    **{
        f"{split}_{name}": f"{DATA}/{split}/{name}"
        for split in SPLITS
        for name in ("wav.scp", "text")
    },
}
# who spoke each synthetic utterance (engine, voice): copied into data.list by make_list
VOICE_OUTPUTS = (
    {f"{split}_utt2voice": f"{DATA}/{split}/utt2voice" for split in SPLITS}
    if CORPUS["name"] == "synthetic"
    else {}
)


if CORPUS["name"] == "synthetic":

    rule synthesize_corpus:
        input:
            script=script("synthesize_corpus.py"),
            code=code_of("synthesize_corpus.py"),
        output:
            **CORPUS_OUTPUTS,
            **VOICE_OUTPUTS,
        log:
            f"{RESULTS}/logs/synthesize_corpus.log",
        benchmark:
            f"{RESULTS}/benchmarks/synthesize_corpus.tsv"
        conda:
            "../../environment.yml"
        threads: 2
        params:
            out_dir=lambda wildcards, output: Path(output.words).parent.parent,
            args=synth_args(),
        shell:
            "python {input.script} --out-dir {params.out_dir} {params.args}"
            " --threads {threads} > {log} 2>&1"

else:

    rule prepare_corpus:
        input:
            script=script("prepare_corpus.py"),
            code=code_of("prepare_corpus.py"),
        output:
            **CORPUS_OUTPUTS,
        log:
            f"{RESULTS}/logs/prepare_corpus.log",
        benchmark:
            f"{RESULTS}/benchmarks/prepare_corpus.tsv"
        conda:
            "../../environment.yml"
        params:
            args=recipe_args(),
            out_dir=lambda wildcards, output: Path(output.words).parent.parent,
        shell:
            "python {input.script} {params.args} --out-dir {params.out_dir} > {log} 2>&1"


rule make_list:
    input:
        wav_scp=f"{DATA}/{{split}}/wav.scp",
        text=f"{DATA}/{{split}}/text",
        words=f"{DATA}/dict/words.txt",
        utt2voice=lambda wildcards: VOICE_OUTPUTS.get(
            f"{wildcards.split}_utt2voice", []
        ),
        script=script("make_list.py"),
        code=code_of("make_list.py"),
    output:
        wav_dur=f"{DATA}/{{split}}/wav.dur",
        data_list=f"{DATA}/{{split}}/data.list",
    log:
        f"{RESULTS}/logs/make_list.{{split}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/make_list.{{split}}.tsv"
    conda:
        "../../environment.yml"
    threads: 2
    params:
        data_dir=lambda wildcards, input: Path(input.wav_scp).parent,
    shell:
        "python {input.script} --data-dir {params.data_dir} --dict {input.words} --threads {threads} > {log} 2>&1"
