# Checkpoint averaging, scoring, DET statistics, metrics, plots and the comparison across experiments.


rule average_model:
    input:
        final=f"{RESULTS}/{{exp}}/model/final.yaml",
        script=script("average_model.py"),
        code=code("kws/average.py"),
    output:
        f"{RESULTS}/{{exp}}/avg.pt",
    log:
        f"{RESULTS}/logs/average_model.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/average_model.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    params:
        model_dir=lambda wildcards, input: Path(input.final).parent,
        args=average_args(),
    shell:
        "python {input.script} --model-dir {params.model_dir} {params.args}"
        " --out {output} > {log} 2>&1"


rule score:
    input:
        model=f"{RESULTS}/{{exp}}/avg.pt",
        test=f"{DATA}/test/data.list",
        words=f"{DATA}/dict/words.txt",
        script=script("score.py"),
        code=code("kws/score.py", "kws/features.py", "kws/checkpoint.py", *MODEL_CODE),
    output:
        f"{RESULTS}/{{exp}}/score.txt",
    log:
        f"{RESULTS}/logs/score.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/score.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    threads: 2
    resources:
        gpu=config["score"]["gpu"],
    params:
        args=score_args(),
        launcher=(
            f"python -m kws.gpu --gpus 1 --lock-dir {RESULTS}/.gpu-locks --"
            if config["score"]["gpu"]
            else ""
        ),
    shell:
        "{params.launcher} python {input.script} --checkpoint {input.model} --test-data {input.test}"
        " --dict {input.words} --out {output} {params.args} --threads {threads} > {log} 2>&1"


rule compute_det:
    input:
        score=f"{RESULTS}/{{exp}}/score.txt",
        test=f"{DATA}/test/data.list",
        words=f"{DATA}/dict/words.txt",
        script=script("compute_det.py"),
        code=code("kws/det.py"),
    output:
        metrics=report(
            f"{RESULTS}/{{exp}}/metrics.json",
            caption="../report/metrics.rst",
            category="Metrics",
        ),
        table=report(
            f"{RESULTS}/{{exp}}/metrics.tsv",
            caption="../report/metrics.rst",
            category="Metrics",
        ),
        markdown=f"{RESULTS}/{{exp}}/metrics.md",
        stats=expand(
            f"{RESULTS}/{{{{exp}}}}/det/stats.{{keyword}}.txt", keyword=keywords()
        ),
    log:
        f"{RESULTS}/logs/compute_det.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/compute_det.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    params:
        out_dir=lambda wildcards, output: Path(output.metrics).parent,
        args=det_args(),
    shell:
        "python {input.script} --score {input.score} --test-data {input.test} --dict {input.words}"
        " {params.args} --out-dir {params.out_dir} > {log} 2>&1"


rule plot_det:
    input:
        stats=expand(
            f"{RESULTS}/{{{{exp}}}}/det/stats.{{keyword}}.txt", keyword=keywords()
        ),
        script=script("plot_det.py"),
        code=code("kws/plots.py"),
    output:
        report(
            f"{RESULTS}/{{exp}}/det.png",
            caption="../report/det.rst",
            category="DET curves",
        ),
    log:
        f"{RESULTS}/logs/plot_det.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/plot_det.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    params:
        labels=" ".join(keywords()),
    shell:
        "python {input.script} --stats {input.stats} --labels {params.labels}"
        " --title {wildcards.exp} --out {output} > {log} 2>&1"


rule plot_training:
    input:
        final=f"{RESULTS}/{{exp}}/model/final.yaml",
        script=script("plot_training.py"),
        code=code("kws/plots.py"),
    output:
        report(
            f"{RESULTS}/{{exp}}/training.png",
            caption="../report/training.rst",
            category="Training",
        ),
    log:
        f"{RESULTS}/logs/plot_training.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/plot_training.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    params:
        table=lambda wildcards, input: Path(input.final).parent / "train_log.tsv",
    shell:
        "python {input.script} --log {params.table} --title {wildcards.exp} --out {output} > {log} 2>&1"


rule compare_experiments:
    input:
        metrics=expand(f"{RESULTS}/{{exp}}/metrics.json", exp=EXPERIMENTS),
        stats=expand(
            f"{RESULTS}/{{exp}}/det/stats.{{keyword}}.txt",
            exp=EXPERIMENTS,
            keyword=keywords(),
        ),
        script=script("compare_experiments.py"),
        plot_script=script("plot_det.py"),
        code=code("kws/det.py", "kws/plots.py"),
    output:
        plot=report(
            f"{RESULTS}/comparison/det.png",
            caption="../report/det.rst",
            category="Comparison",
        ),
        markdown=f"{RESULTS}/comparison/metrics.md",
        table=report(
            f"{RESULTS}/comparison/metrics.tsv",
            caption="../report/metrics.rst",
            category="Comparison",
        ),
    log:
        f"{RESULTS}/logs/compare_experiments.log",
    benchmark:
        f"{RESULTS}/benchmarks/compare_experiments.tsv"
    conda:
        "../../environment.yml"
    params:
        names=" ".join(EXPERIMENTS),
    shell:
        "(python {input.script} --metrics {input.metrics} --names {params.names}"
        " --out-md {output.markdown} --out-tsv {output.table}"
        " && python {input.plot_script} --compare --stats {input.stats} --out {output.plot}) > {log} 2>&1"
