"""The README's TVMScript example runs as written (compile-only without a GPU; top-2 on two workers
to keep CI short)."""

import pathlib
import re
import warnings

README = pathlib.Path(__file__).parents[1] / "README.md"


def test_the_tvmscript_example_runs_as_written(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next(b for b in blocks if "@T.prim_func(s_tir=True)" in b)
    # TVMScript reads a function's source from its file: run the block as a module of its own
    path = tmp_path / "readme_example.py"
    path.write_text(example.replace("topk=8", "topk=2, max_workers=2"))
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no GPU: nothing timed"
        namespace = {}
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    best = namespace["best"]
    assert best.compiled and best.config.kind == "elementwise"
