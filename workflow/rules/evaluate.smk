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


# With score.phone_check a list, the check's alpha of each model, chosen on its dev split.
rule choose_phone_check:
    input:
        model=f"{OUT}/{{exp}}/avg.pt",
        dev=f"{DATA}/dev/data.list",
        words=f"{DATA}/dict/words.txt",
        script=script("choose_phone_check.py"),
        code=code_of("choose_phone_check.py"),
    output:
        f"{OUT}/{{exp}}/phone_check.json",
    log:
        f"{OUT}/logs/choose_phone_check.{{exp}}.log",
    benchmark:
        f"{OUT}/benchmarks/choose_phone_check.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    threads: 2
    resources:
        gpu=config["score"]["gpu"],
    params:
        args=phone_check_choice_args() if phone_check_chosen() else "",
        launcher=score_launcher(),
    shell:
        "{params.launcher} python {input.script} --checkpoint {input.model} --dev-data {input.dev}"
        " --dict {input.words} {params.args} --threads {threads} --out {output} > {log} 2>&1"


# `test` (in-domain: held-out voices of the training engines) and, with corpus.heldout_engine, `test_engine`
# (an engine never heard in training), each scored and DET'd the same way.
for evalset in EVAL_SPLITS:

    rule:
        name:
            eval_rule("score", evalset)
        input:
            model=f"{OUT}/{{exp}}/avg.pt",
            test=f"{DATA}/{evalset}/data.list",
            words=f"{DATA}/dict/words.txt",
            phone_check=phone_check_input(),
            script=script("score.py"),
            code=code_of("score.py"),
        output:
            f"{eval_dir(evalset)}/score.txt",
        log:
            f"{OUT}/logs/{eval_rule('score', evalset)}.{{exp}}.log",
        benchmark:
            f"{OUT}/benchmarks/{eval_rule('score', evalset)}.{{exp}}.tsv"
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
            phone_check=phone_check_argument(),
            launcher=score_launcher(),
        shell:
            "{params.launcher} python {input.script} --checkpoint {input.model} --test-data {input.test}"
            " --dict {input.words} --out {output} {params.args} {params.phone_check}"
            + phone_check_from_file()
            + " --batch-size {resources.batch_size}"
            " --threads {threads} > {log} 2>&1"

    rule:
        name:
            eval_rule("compute_det", evalset)
        input:
            score=f"{eval_dir(evalset)}/score.txt",
            test=f"{DATA}/{evalset}/data.list",
            words=f"{DATA}/dict/words.txt",
            script=script("compute_det.py"),
            code=code_of("compute_det.py"),
            # a held-out split is also scored at the thresholds the export takes from test's metrics
            reference=[] if evalset == "test" else f"{OUT}/{{exp}}/metrics.json",
        output:
            metrics=report(
                f"{eval_dir(evalset)}/metrics.json",
                caption="../report/metrics.rst",
                category="Metrics",
            ),
            table=report(
                f"{eval_dir(evalset)}/metrics.tsv",
                caption="../report/metrics.rst",
                category="Metrics",
            ),
            markdown=report(
                f"{eval_dir(evalset)}/metrics.md",
                caption="../report/metrics.rst",
                category="Metrics",
            ),
            stats=expand(
                f"{eval_dir(evalset, for_expand=True)}/det/stats.{{keyword}}.txt",
                keyword=keywords(),
            ),
        log:
            f"{OUT}/logs/{eval_rule('compute_det', evalset)}.{{exp}}.log",
        benchmark:
            f"{OUT}/benchmarks/{eval_rule('compute_det', evalset)}.{{exp}}.tsv"
        conda:
            "../../environment.yml"
        params:
            out_dir=lambda wildcards, output: Path(output.metrics).parent,
            args=det_args(),
            reference=lambda wildcards, input: reference_args(input.reference),
        shell:
            "python {input.script} --score {input.score} --test-data {input.test} --dict {input.words}"
            " {params.args} {params.reference} --out-dir {params.out_dir} > {log} 2>&1"

    rule:
        name:
            eval_rule("plot_det", evalset)
        input:
            stats=expand(
                f"{eval_dir(evalset, for_expand=True)}/det/stats.{{keyword}}.txt",
                keyword=keywords(),
            ),
            script=script("plot_det.py"),
            code=code_of("plot_det.py"),
        output:
            report(
                f"{eval_dir(evalset)}/det.png",
                caption="../report/det.rst",
                category="DET curves",
            ),
        log:
            f"{OUT}/logs/{eval_rule('plot_det', evalset)}.{{exp}}.log",
        benchmark:
            f"{OUT}/benchmarks/{eval_rule('plot_det', evalset)}.{{exp}}.tsv"
        conda:
            "../../environment.yml"
        params:
            labels=" ".join(keywords()),
            suffix="" if evalset == "test" else f"-{evalset}",
        shell:
            "python {input.script} --stats {input.stats} --labels {params.labels}"
            " --title {wildcards.exp}{params.suffix} --out {output} > {log} 2>&1"


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
        # a held-out engine's split beside test, each run also at its exported thresholds
        heldout=(
            expand(f"{eval_dir(HELDOUT_SPLIT)}/metrics.json", exp=EXPERIMENTS)
            if HELDOUT_SPLIT in EVAL_SPLITS
            else []
        ),
        script=script("compare_experiments.py"),
        code=code_of("compare_experiments.py"),
    output:
        plot=report(
            f"{OUT}/comparison/det.png",
            caption="../report/det.rst",
            category="Comparison",
        ),
        markdown=report(
            f"{OUT}/comparison/metrics.md",
            caption="../report/metrics.rst",
            category="Comparison",
        ),
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
        # the experiment of each run: an experiment's seeds get a median [min-max] row
        experiments=" ".join(RUNS[run][0] for run in EXPERIMENTS),
        heldout=lambda wildcards, input: (
            f"--heldout-metrics {input.heldout} --heldout-split {HELDOUT_SPLIT}"
            if input.heldout
            else ""
        ),
    shell:
        "python {input.script} --metrics {input.metrics} --names {params.names}"
        " --experiments {params.experiments} {params.heldout} --out-md {output.markdown}"
        " --out-tsv {output.table} --out-plot {output.plot} > {log} 2>&1"
