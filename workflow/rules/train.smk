# torchrun DDP training: GPUs through `resources: gpu=N` (with device locks), else gloo CPU processes;
# on several nodes one torchrun per node (kws.launch, SLURM).


rule train:
    input:
        unpack(audio_stores),
        train=training_list("train"),
        cv=training_list("dev"),
        words=f"{DATA}/dict/words.txt",
        cmvn=lambda wildcards: cmvn_file(wildcards.exp),
        model_config=lambda wildcards: model_config_path(wildcards.exp),
        script=script("train.py"),
        code=code_of("train.py"),
    output:
        f"{OUT}/{{exp}}/model/final.yaml",
    log:
        f"{OUT}/logs/train.{{exp}}.log",
    benchmark:
        f"{OUT}/benchmarks/train.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    threads: lambda wildcards: max(1, train_processes(wildcards.exp))
    resources:
        gpu=train_resource("gpu"),
        nodes=train_resource("nodes"),
        mpi=train_resource("mpi"),
        tasks=train_resource("tasks"),
        tasks_per_gpu=train_resource("tasks_per_gpu"),
        gres=train_resource("gres"),
        slurm_extra=train_resource("slurm_extra"),
        mem_mb=train_mem_mb,
        # A resource, not a param: the timeout does not change the model, so it must not retrain it.
        timeout_s=config["train"]["timeout_s"],
    params:
        model_dir=lambda wildcards, output: Path(output[0]).parent,
        launcher=lambda wildcards: launcher(wildcards.exp),
        args=lambda wildcards: train_args(wildcards.exp),
    shell:
        # kws.supervise: nothing of the training outlives Snakemake ($PPID) or the job, and each
        # attempt's log is kept under logs/attempts/ (Snakemake deletes the log before a rerun).
        "python -m kws.supervise --log {log} --watch-pid $PPID --"
        " {params.launcher} {input.script} --config {input.model_config} --train_data {input.train}"
        " --cv_data {input.cv} --train_audio_store {input.train_store} --cv_audio_store {input.cv_store}"
        " --dict {input.words} --cmvn_file {input.cmvn} --norm_var --model_dir {params.model_dir}"
        " --restart_on_change"
        " {params.args} --timeout {resources.timeout_s} --threads {threads}"


rule resolve_config:
    input:
        model_config=lambda wildcards: model_config_path(wildcards.exp),
        script=script("resolve_config.py"),
        code=code_of("resolve_config.py"),
    output:
        report(
            f"{OUT}/{{exp}}/config.yaml",
            caption="../report/config.rst",
            category="Configuration",
        ),
    log:
        f"{OUT}/logs/resolve_config.{{exp}}.log",
    benchmark:
        f"{OUT}/benchmarks/resolve_config.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    params:
        experiment=lambda wildcards: json.dumps(
            run_record(wildcards.exp), sort_keys=True
        ),
        pipeline=json.dumps(
            {k: v for k, v in config.items() if k != "experiments"}, sort_keys=True
        ),
    shell:
        "python {input.script} --model-config {input.model_config} --experiment {params.experiment:q}"
        " --pipeline {params.pipeline:q} --out {output} > {log} 2>&1"


rule smoke_slice:
    input:
        data_list=f"{DATA}/{{split}}/data.list",
        script=script("slice_list.py"),
        code=code_of("slice_list.py"),
    output:
        f"{RESULTS}/smoke/data/{{split}}/data.list",
    log:
        f"{RESULTS}/smoke/logs/smoke_slice.{{split}}.log",
    benchmark:
        f"{RESULTS}/smoke/benchmarks/smoke_slice.{{split}}.tsv"
    conda:
        "../../environment.yml"
    params:
        args=f"--utterances {config['smoke_utterances']}",
    shell:
        "python {input.script} --data-list {input.data_list} {params.args} --out {output} > {log} 2>&1"
