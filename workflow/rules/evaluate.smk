# Checkpoint averaging, scoring, DET statistics, metrics, plots and the comparison across experiments.


rule average_model:
    input:
        final=f"{OUT}/{{exp}}/model/final.yaml",
        script=script("average_model.py"),
        code=code_of("average_model.py"),
    output:
        f"{OUT}/{{exp}}/avg.pt",
    log:
        f"{OUT}/logs/average_model.{{exp}}.log",
    benchmark:
        f"{OUT}/benchmarks/average_model.{{exp}}.tsv"
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
        model=f"{OUT}/{{exp}}/avg.pt",
        test=f"{DATA}/test/data.list",
        words=f"{DATA}/dict/words.txt",
        script=script("score.py"),
        code=code_of("score.py"),
    output:
        f"{OUT}/{{exp}}/score.txt",
    log:
        f"{OUT}/logs/score.{{exp}}.log",
    benchmark:
        f"{OUT}/benchmarks/score.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    threads: 2
    resources:
        gpu=config["score"]["gpu"],
        # A resource, not a param: the batch size changes the speed, not a score (score.txt is
        # byte-identical at any size), so it must not rescore.
        batch_size=config["score"]["batch_size"],
    params:
        args=score_args(),
        launcher=(
            f"python -m kws.gpu --gpus 1 --lock-dir {OUT}/.gpu-locks --"
            if config["score"]["gpu"]
            else ""
        ),
    shell:
        "{params.launcher} python {input.script} --checkpoint {input.model} --test-data {input.test}"
        " --dict {input.words} --out {output} {params.args} --batch-size {resources.batch_size}"
        " --threads {threads} > {log} 2>&1"


rule compute_det:
    input:
        score=f"{OUT}/{{exp}}/score.txt",
        test=f"{DATA}/test/data.list",
        words=f"{DATA}/dict/words.txt",
        script=script("compute_det.py"),
        code=code_of("compute_det.py"),
    output:
        metrics=report(
            f"{OUT}/{{exp}}/metrics.json",
            caption="../report/metrics.rst",
            category="Metrics",
        ),
        table=report(
            f"{OUT}/{{exp}}/metrics.tsv",
            caption="../report/metrics.rst",
            category="Metrics",
        ),
        markdown=f"{OUT}/{{exp}}/metrics.md",
        stats=expand(f"{OUT}/{{{{exp}}}}/det/stats.{{keyword}}.txt", keyword=keywords()),
    log:
        f"{OUT}/logs/compute_det.{{exp}}.log",
    benchmark:
        f"{OUT}/benchmarks/compute_det.{{exp}}.tsv"
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
        stats=expand(f"{OUT}/{{{{exp}}}}/det/stats.{{keyword}}.txt", keyword=keywords()),
        script=script("plot_det.py"),
        code=code_of("plot_det.py"),
    output:
        report(
            f"{OUT}/{{exp}}/det.png",
            caption="../report/det.rst",
            category="DET curves",
        ),
    log:
        f"{OUT}/logs/plot_det.{{exp}}.log",
    benchmark:
        f"{OUT}/benchmarks/plot_det.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    params:
        labels=" ".join(keywords()),
    shell:
        "python {input.script} --stats {input.stats} --labels {params.labels}"
        " --title {wildcards.exp} --out {output} > {log} 2>&1"


rule plot_training:
    input:
        final=f"{OUT}/{{exp}}/model/final.yaml",
        script=script("plot_training.py"),
        code=code_of("plot_training.py"),
    output:
        report(
            f"{OUT}/{{exp}}/training.png",
            caption="../report/training.rst",
            category="Training",
        ),
    log:
        f"{OUT}/logs/plot_training.{{exp}}.log",
    benchmark:
        f"{OUT}/benchmarks/plot_training.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    params:
        table=lambda wildcards, input: Path(input.final).parent / "train_log.tsv",
    shell:
        "python {input.script} --log {params.table} --title {wildcards.exp} --out {output} > {log} 2>&1"


rule compare_experiments:
    input:
        metrics=expand(f"{OUT}/{{exp}}/metrics.json", exp=EXPERIMENTS),
        stats=expand(
            f"{OUT}/{{exp}}/det/stats.{{keyword}}.txt",
            exp=EXPERIMENTS,
            keyword=keywords(),
        ),
        script=script("compare_experiments.py"),
        plot_script=script("plot_det.py"),
        code=code_of("compare_experiments.py", "plot_det.py"),
    output:
        plot=report(
            f"{OUT}/comparison/det.png",
            caption="../report/det.rst",
            category="Comparison",
        ),
        markdown=f"{OUT}/comparison/metrics.md",
        table=report(
            f"{OUT}/comparison/metrics.tsv",
            caption="../report/metrics.rst",
            category="Comparison",
        ),
    log:
        f"{OUT}/logs/compare_experiments.log",
    benchmark:
        f"{OUT}/benchmarks/compare_experiments.tsv"
    conda:
        "../../environment.yml"
    params:
        names=" ".join(EXPERIMENTS),
    shell:
        "(python {input.script} --metrics {input.metrics} --names {params.names}"
        " --out-md {output.markdown} --out-tsv {output.table}"
        " && python {input.plot_script} --compare --stats {input.stats} --out {output.plot}) > {log} 2>&1"
