# Global CMVN statistics of the training set, one per feature setting (shared by experiments).


rule compute_cmvn:
    input:
        data_list=f"{DATA}/train/data.list",
        script=script("compute_cmvn.py"),
        code=code_of("compute_cmvn.py"),
    output:
        f"{RESULTS}/cmvn/{{feat}}/global_cmvn",
    log:
        f"{RESULTS}/logs/compute_cmvn.{{feat}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/compute_cmvn.{{feat}}.tsv"
    conda:
        "../../environment.yml"
    threads: 2
    params:
        fbank=lambda wildcards: json.dumps(FEATURES[wildcards.feat], sort_keys=True),
    shell:
        "python {input.script} --data-list {input.data_list} --fbank-json {params.fbank:q}"
        " --threads {threads} --out {output} > {log} 2>&1"
