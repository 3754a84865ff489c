# Audio store: each training split's audio decoded once into a memory-mapped int16 array
# (kws.audio_store), so training epochs slice samples instead of opening and decoding wav files;
# fbank and augmentation happen on each batch, on the training device.


rule pack_audio:
    input:
        data_list=f"{DATA}/{{split}}/data.list",
        script=script("pack_audio.py"),
        code=code_of("pack_audio.py"),
    output:
        directory(f"{RESULTS}/audio/{{split}}"),
    log:
        f"{RESULTS}/logs/pack_audio.{{split}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/pack_audio.{{split}}.tsv"
    conda:
        "../../environment.yml"
    threads: 2
    shell:
        "python {input.script} --data-list {input.data_list} --threads {threads} --out {output} > {log} 2>&1"
