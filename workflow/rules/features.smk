# Feature cache (config train.feature_cache): each split's fbank computed once per feature setting into a
# memory-mapped array (kws.feature_cache), so training epochs read features instead of decoding and
# extracting them. Cached with dither 0: training from the cache does not apply the fbank dither.


rule cache_features:
    input:
        data_list=f"{DATA}/{{split}}/data.list",
        script=script("cache_features.py"),
        code=code_of("cache_features.py"),
    output:
        directory(f"{RESULTS}/features/{{feat}}/{{split}}"),
    log:
        f"{RESULTS}/logs/cache_features.{{feat}}.{{split}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/cache_features.{{feat}}.{{split}}.tsv"
    conda:
        "../../environment.yml"
    threads: 2
    params:
        fbank=lambda wildcards: json.dumps(FEATURES[wildcards.feat], sort_keys=True),
    shell:
        "python {input.script} --data-list {input.data_list} --fbank-json {params.fbank:q}"
        " --threads {threads} --out {output} > {log} 2>&1"
