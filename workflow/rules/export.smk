# Export for streaming inference: ONNX and TorchScript with the cache, checked against PyTorch, and the
# deployed detector scored over the whole test split beside the offline figures (kws.deployed).


rule export_model:
    input:
        model=f"{OUT}/{{exp}}/avg.pt",
        metrics=f"{OUT}/{{exp}}/metrics.json",
        test=f"{DATA}/test/data.list",
        score=f"{OUT}/{{exp}}/score.txt",
        words=f"{DATA}/dict/words.txt",
        phone_check=phone_check_input(),
        script=script("export_model.py"),
        code=code_of("export_model.py"),
    output:
        onnx=f"{OUT}/{{exp}}/export/model.onnx",
        torchscript=f"{OUT}/{{exp}}/export/model.pt",
        summary=f"{OUT}/{{exp}}/export/export.json",
        deployed=report(
            f"{OUT}/{{exp}}/export/deployed.md",
            caption="../report/deployed.rst",
            category="Export",
        ),
    log:
        f"{OUT}/logs/export_model.{{exp}}.log",
    benchmark:
        f"{OUT}/benchmarks/export_model.{{exp}}.tsv"
    conda:
        "../../environment.yml"
    threads: 2
    params:
        out_dir=lambda wildcards, output: Path(output.onnx).parent,
        # the deployed detector (kws-detect's defaults) runs over the whole test split, streams included
        args=export_args(),
        phone_check=phone_check_argument(),
    shell:
        "python {input.script} --checkpoint {input.model} --dict {input.words} --metrics {input.metrics}"
        " --test-data {input.test} --score {input.score} {params.args} {params.phone_check}"
        + phone_check_from_file()
        + " --threads {threads}"
        " --out-dir {params.out_dir} > {log} 2>&1"
