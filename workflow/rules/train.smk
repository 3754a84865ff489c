# torchrun DDP training: GPUs through `resources: gpu=N` (with device locks), else gloo CPU processes.


rule train:
    input:
        train=f"{DATA}/train/data.list",
        cv=f"{DATA}/dev/data.list",
        cmvn=lambda wildcards: cmvn_file(wildcards.exp),
        model_config=lambda wildcards: model_config_path(wildcards.exp),
        code=code(
            "scripts/train.py",
            "kws/trainer.py",
            "kws/dataset.py",
            "kws/checkpoint.py",
            "kws/loss.py",
            "kws/model/__init__.py",
            "kws/features.py",
        ),
    output:
        f"{RESULTS}/{{exp}}/model/final.yaml",
    params:
        model_dir=f"{RESULTS}/{{exp}}/model",
        launcher=lambda wildcards: launcher(wildcards.exp),
        overrides=lambda wildcards: override_args(wildcards.exp),
        num_keywords=len(keywords()),
        seed=config["train"]["seed"],
        num_workers=config["train"]["num_workers"],
        min_duration=config["train"]["min_duration"],
        backend=config["train"]["dist_backend"],
        timeout=config["train"]["timeout_s"],
    threads: lambda wildcards: max(1, train_processes(wildcards.exp))
    resources:
        gpu=lambda wildcards: train_gpus(wildcards.exp),
        mem_mb=lambda wildcards: 4000 * max(1, train_processes(wildcards.exp)),
    log:
        f"{RESULTS}/logs/train.{{exp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    shell:
        "{params.launcher} {SCRIPTS}/train.py --config {input.model_config} {params.overrides}"
        " --train_data {input.train} --cv_data {input.cv} --model_dir {params.model_dir}"
        " --cmvn_file {input.cmvn} --norm_var --num_keywords {params.num_keywords}"
        " --min_duration {params.min_duration} --seed {params.seed} --num_workers {params.num_workers}"
        " --ddp.dist_backend {params.backend} --timeout {params.timeout} --threads {threads} > {log} 2>&1"
