# Data preparation: the corpus (synthesised, or a real one the user downloaded), then WeKws data lists.

CORPUS_OUTPUTS = {
    "words": f"{DATA}/dict/words.txt",
    **{f"{split}_{name}": f"{DATA}/{split}/{name}" for split in SPLITS for name in ("wav.scp", "text")},
}


if CORPUS["name"] == "synthetic":

    rule synthesize_corpus:
        input:
            code=code("scripts/synthesize_corpus.py", "kws/synth/espeak.py", "kws/synth/augment.py", "kws/synth/corpus.py"),
        output:
            **CORPUS_OUTPUTS,
        params:
            out_dir=DATA,
            size=CORPUS["size"],
            seed=CORPUS["seed"],
            augment="--augment" if CORPUS["augment"] else "--no-augment",
        threads: 2
        log:
            f"{RESULTS}/logs/synthesize_corpus.log",
        benchmark:
            f"{RESULTS}/benchmarks/synthesize_corpus.tsv"
        conda:
            "../../environment.yml"
        shell:
            "python {SCRIPTS}/synthesize_corpus.py --out-dir {params.out_dir} --size {params.size}"
            " --seed {params.seed} {params.augment} --threads {threads} > {log} 2>&1"

else:

    rule prepare_corpus:
        input:
            code=code("scripts/prepare_corpus.py", "kws/recipes.py"),
        output:
            **CORPUS_OUTPUTS,
        params:
            corpus=CORPUS["name"],
            root=CORPUS["root"],
            keywords=" ".join(CORPUS["keywords"]),
            out_dir=DATA,
        log:
            f"{RESULTS}/logs/prepare_corpus.log",
        benchmark:
            f"{RESULTS}/benchmarks/prepare_corpus.tsv"
        conda:
            "../../environment.yml"
        shell:
            "python {SCRIPTS}/prepare_corpus.py --corpus {params.corpus} --root {params.root:q}"
            " --out-dir {params.out_dir} --keywords {params.keywords} > {log} 2>&1"


rule make_list:
    input:
        wav_scp=f"{DATA}/{{split}}/wav.scp",
        text=f"{DATA}/{{split}}/text",
        words=f"{DATA}/dict/words.txt",
        code=code("scripts/make_list.py", "kws/lists.py", "kws/datalist.py", "kws/audio.py"),
    output:
        wav_dur=f"{DATA}/{{split}}/wav.dur",
        data_list=f"{DATA}/{{split}}/data.list",
    threads: 2
    log:
        f"{RESULTS}/logs/make_list.{{split}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/make_list.{{split}}.tsv"
    conda:
        "../../environment.yml"
    shell:
        "python {SCRIPTS}/make_list.py --data-dir {DATA}/{wildcards.split} --dict {input.words} > {log} 2>&1"
