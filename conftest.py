"""Settings shared by the unit tests (tests/) and the notebook checks (notebooks/, nbval): notebook kernels inherit
these variables, so no test run reads or writes this machine's run cache or the repository's run store."""
import os
import tempfile

os.environ.setdefault("TQDM_DISABLE", "1")
for _name, _prefix in (("SUBFL_STORE_DIR", "store"), ("SUBFL_WORK_DIR", "work"), ("SUBFL_CACHE_DIR", "cache"),
                       ("SUBFL_ARTIFACTS_DIR", "artifacts")):
    os.environ.setdefault(_name, tempfile.mkdtemp(prefix=f"subfl-test-{_prefix}-"))
