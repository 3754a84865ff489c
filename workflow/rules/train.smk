# torchrun DDP training: GPUs through `resources: gpu=N` (with device locks), else gloo CPU processes.


rule train:
    input:
        train=f"{DATA}/train/data.list",
        cv=f"{DATA}/dev/data.list",
        cmvn=lambda wildcards: cmvn_file(wildcards.exp),
        model_config=lambda wildcards: model_config_path(wildcards.exp),
        script=script("train.py"),
        code=code(
            "kws/trainer.py",
            "kws/dataset.py",
            "kws/checkpoint.py",
            "kws/loss.py",
            "kws/features.py",
            *MODEL_CODE,
        ),
    output:
        f"{RESULTS}/{{exp}}/model/final.yaml",
    log:
        f"{RESULTS}/logs/train.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    threads: lambda wildcards: max(1, train_processes(wildcards.exp))
    resources:
        gpu=lambda wildcards: train_gpus(wildcards.exp),
        mem_mb=lambda wildcards: 4000 * max(1, train_processes(wildcards.exp)),
        # A resource, not a param: the timeout does not change the model, so it must not retrain it.
        timeout_s=config["train"]["timeout_s"],
    params:
        model_dir=lambda wildcards, output: Path(output[0]).parent,
        launcher=lambda wildcards: launcher(wildcards.exp),
        args=lambda wildcards: train_args(wildcards.exp),
    shell:
        "{params.launcher} {input.script} --config {input.model_config} --train_data {input.train}"
        " --cv_data {input.cv} --cmvn_file {input.cmvn} --norm_var --model_dir {params.model_dir} --restart_on_change"
        " {params.args} --timeout {resources.timeout_s} --threads {threads} > {log} 2>&1"


rule resolve_config:
    input:
        model_config=lambda wildcards: model_config_path(wildcards.exp),
        script=script("resolve_config.py"),
        code=code("kws/config.py"),
    output:
        report(
            f"{RESULTS}/{{exp}}/config.yaml",
            caption="../report/config.rst",
            category="Configuration",
        ),
    log:
        f"{RESULTS}/logs/resolve_config.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/resolve_config.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    params:
        experiment=lambda wildcards: json.dumps(
            experiment(wildcards.exp), sort_keys=True
        ),
        pipeline=json.dumps(
            {k: v for k, v in config.items() if k != "experiments"}, sort_keys=True
        ),
    shell:
        "python {input.script} --model-config {input.model_config} --experiment {params.experiment:q}"
        " --pipeline {params.pipeline:q} --out {output} > {log} 2>&1"
