"""Write this folder's spec and job file from `dbn submit examples/yarn.toml --dry-run`.

    python yarn_specs/regenerate.py

``tests/test_yarn_spec.py`` checks that the files here are what this makes, so they never
drift from what ``dbn submit`` actually sends.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = "hdfs:///user/me/envs/dbn-yarn.tar.gz"
HEADER = """\
# A DBN job on YARN: the paper's MNIST run (784-500-500-2000-10) on 10 worker
# containers, as `dbn submit examples/yarn.toml --dry-run --env {env}`
# prints it (`python yarn_specs/regenerate.py` writes this file). `dbn submit` writes such
# a spec for every job; this copy is for reading, and for `skein application submit
# yarn_specs/mnist.yaml` by hand (edit the hdfs:// URIs in mnist-job.json and the
# environment archive first). Relative file sources are resolved against this directory.
"""


def generate() -> dict[str, str]:
    """``{file name: text}`` of the spec and its job file."""
    from dbn.jobs.spec import load_spec
    from dbn.jobs.yarn import prepare
    from iterreduce.launch.yarn.appspec import spec_yaml

    spec = load_spec(HERE.parent / "examples" / "yarn.toml", {"yarn.env": ENV})
    submission = prepare(spec, dry_run=True, log=lambda message: None)
    submission.job["spec"]["source"] = "examples/yarn.toml"  # not this machine's absolute path
    submission.job["spec"]["data"]["mnist_dir"] = None
    app = submission.spec
    for target in (app.master, *app.services.values()):
        target.files["job.json"].source = str(HERE / "mnist-job.json")  # written back relative, below
    yaml = spec_yaml(app).replace(f"file://{HERE}/", "")
    return {"mnist.yaml": HEADER.format(env=ENV) + yaml, "mnist-job.json": json.dumps(submission.job, indent=2) + "\n"}


if __name__ == "__main__":
    for name, text in generate().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}")
