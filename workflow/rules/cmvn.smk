# Global CMVN statistics of the training set, one per feature setting (shared by experiments).


rule compute_cmvn:
    input:
        data_list=f"{DATA}/train/data.list",
        code=code("scripts/compute_cmvn.py", "kws/cmvn.py", "kws/features.py", "kws/audio.py"),
    output:
        f"{RESULTS}/cmvn/{{feat}}/global_cmvn",
    params:
        fbank=lambda wildcards: json.dumps(FEATURES[wildcards.feat], sort_keys=True),
    threads: 2
    log:
        f"{RESULTS}/logs/compute_cmvn.{{feat}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/compute_cmvn.{{feat}}.tsv"
    conda:
        "../../environment.yml"
    shell:
        "python {SCRIPTS}/compute_cmvn.py --data-list {input.data_list} --fbank-json {params.fbank:q}"
        " --threads {threads} --out {output} > {log} 2>&1"
