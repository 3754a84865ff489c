# Checkpoint averaging, scoring, DET statistics, metrics, plots and the comparison across experiments.


rule average_model:
    input:
        final=f"{RESULTS}/{{exp}}/model/final.yaml",
        code=code("scripts/average_model.py", "kws/average.py"),
    output:
        f"{RESULTS}/{{exp}}/avg.pt",
    params:
        model_dir=f"{RESULTS}/{{exp}}/model",
        num=config["average"]["num"],
        mode=config["average"]["mode"],
    log:
        f"{RESULTS}/logs/average_model.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/average_model.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    shell:
        "python {SCRIPTS}/average_model.py --model-dir {params.model_dir} --num {params.num}"
        " --mode {params.mode} --out {output} > {log} 2>&1"


rule score:
    input:
        model=f"{RESULTS}/{{exp}}/avg.pt",
        test=f"{DATA}/test/data.list",
        words=f"{DATA}/dict/words.txt",
        code=code("scripts/score.py", "kws/score.py", "kws/features.py", "kws/model/__init__.py"),
    output:
        f"{RESULTS}/{{exp}}/score.txt",
    params:
        batch_size=config["score"]["batch_size"],
        device="cuda" if config["score"]["gpu"] else "cpu",
        launcher=(
            f"python -m kws.gpu --gpus 1 --lock-dir {RESULTS}/.gpu-locks --"
            if config["score"]["gpu"]
            else ""
        ),
    threads: 2
    resources:
        gpu=config["score"]["gpu"],
    log:
        f"{RESULTS}/logs/score.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/score.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    shell:
        "{params.launcher} python {SCRIPTS}/score.py --checkpoint {input.model} --test-data {input.test}"
        " --dict {input.words} --out {output} --batch-size {params.batch_size} --device {params.device}"
        " --threads {threads} > {log} 2>&1"


rule compute_det:
    input:
        score=f"{RESULTS}/{{exp}}/score.txt",
        test=f"{DATA}/test/data.list",
        words=f"{DATA}/dict/words.txt",
        code=code("scripts/compute_det.py", "kws/det.py"),
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
        stats=expand(f"{RESULTS}/{{{{exp}}}}/det/stats.{{keyword}}.txt", keyword=keywords()),
    params:
        out_dir=f"{RESULTS}/{{exp}}",
        step=config["det"]["step"],
        window_shift=config["det"]["window_shift"],
        fa_targets=" ".join(str(x) for x in config["det"]["fa_targets"]),
    log:
        f"{RESULTS}/logs/compute_det.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/compute_det.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    shell:
        "python {SCRIPTS}/compute_det.py --score {input.score} --test-data {input.test} --dict {input.words}"
        " --step {params.step} --window-shift {params.window_shift} --fa-targets {params.fa_targets}"
        " --out-dir {params.out_dir} > {log} 2>&1"


rule plot_det:
    input:
        stats=expand(f"{RESULTS}/{{{{exp}}}}/det/stats.{{keyword}}.txt", keyword=keywords()),
        code=code("scripts/plot_det.py", "kws/plots.py"),
    output:
        report(f"{RESULTS}/{{exp}}/det.png", caption="../report/det.rst", category="DET curves"),
    params:
        labels=" ".join(keywords()),
    log:
        f"{RESULTS}/logs/plot_det.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/plot_det.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    shell:
        "python {SCRIPTS}/plot_det.py --stats {input.stats} --labels {params.labels}"
        " --title {wildcards.exp} --out {output} > {log} 2>&1"


rule plot_training:
    input:
        final=f"{RESULTS}/{{exp}}/model/final.yaml",
        code=code("scripts/plot_training.py", "kws/plots.py"),
    output:
        report(f"{RESULTS}/{{exp}}/training.png", caption="../report/training.rst", category="Training"),
    params:
        log=f"{RESULTS}/{{exp}}/model/train_log.tsv",
    log:
        f"{RESULTS}/logs/plot_training.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/plot_training.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    shell:
        "python {SCRIPTS}/plot_training.py --log {params.log} --title {wildcards.exp} --out {output} > {log} 2>&1"


rule compare_experiments:
    input:
        metrics=expand(f"{RESULTS}/{{exp}}/metrics.json", exp=EXPERIMENTS),
        stats=expand(f"{RESULTS}/{{exp}}/det/stats.{{keyword}}.txt", exp=EXPERIMENTS, keyword=keywords()),
        code=code("scripts/compare_experiments.py", "scripts/plot_det.py", "kws/det.py", "kws/plots.py"),
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
    params:
        names=" ".join(EXPERIMENTS),
    log:
        f"{RESULTS}/logs/compare_experiments.log",
    benchmark:
        f"{RESULTS}/benchmarks/compare_experiments.tsv"
    conda:
        "../../environment.yml"
    shell:
        "(python {SCRIPTS}/compare_experiments.py --metrics {input.metrics} --names {params.names}"
        " --out-md {output.markdown} --out-tsv {output.table}"
        " && python {SCRIPTS}/plot_det.py --compare --stats {input.stats} --out {output.plot}) > {log} 2>&1"
