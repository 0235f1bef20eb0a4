"""The mode table: `mode=` -> the function that runs it, once the model, task and policy are built.

Every mode function has one signature, `(cfg, record, lm, policy, task, samples, ids, memory_limit) -> rows`:
it fills `record` and returns the prediction rows (empty when nothing is generated). The life cycle
(kvbench.run.life) is the same for all of them; a new mode is one function and one line here.
`NO_MODEL` names the modes that only count, for which no model is loaded (`lm`, `samples`, `ids` are None).
"""

from __future__ import annotations

from omegaconf import DictConfig

from kvbench.models.loaded import LoadedModel
from kvbench.run.static import run_static
from kvbench.serve import run as serve_run


def prompt_report(cfg: DictConfig, record: dict, lm: LoadedModel, policy, task, samples, ids,
                  memory_limit) -> list[dict]:
    """mode=prompt_report: the prompts' statistics alone (already in the record); nothing is generated."""
    record["status"] = "ok"
    return []


MODES = {"run": run_static, "serve": serve_run.execute, "prompt_report": prompt_report,
         "serve_limits": serve_run.execute_limits}
NO_MODEL = ("serve_limits",)  # modes that count without loading the model
