"""examples/k8s/ checked offline, with no cluster: every object against the Kubernetes API's own JSON
schema (kubernetes-validate, strict: an unknown or misspelt field fails), the JobSet against JobSet
v0.12.0's CRD schema (tests/data/k8s, an unmodified copy of kubernetes-sigs/jobset
config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml at v0.12.0, Apache-2.0), the API server's
podFailurePolicy rules the schemas cannot express, and what each verdict of `trainguard run
--foreground` (0 / 75 / 78 / 1) makes of the pod, by the podFailurePolicy's documented semantics (the
first matching rule acts; none matching counts the failure)."""

from __future__ import annotations

import copy
import gzip
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="needs PyYAML (pip install -e '.[test]')")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="needs kubernetes-validate (pip install -e '.[test]')"
)
jsonschema = pytest.importorskip("jsonschema", reason="needs jsonschema (comes with kubernetes-validate)")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "k8s"
JOBSET_CRD = ROOT / "tests" / "data" / "k8s" / "jobset-v0.12.0-crd.yaml.gz"
# podFailurePolicy is GA since 1.31; the newest schema kubernetes-validate ships is checked too.
KUBERNETES_VERSIONS = ("1.31", kubernetes_validate.latest_version())


def _load(name: str) -> dict:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    assert len(docs) == 1
    return docs[0]


def _as_job(template: dict, name: str) -> dict:
    """A JobSet's Job template as the batch/v1 Job the JobSet controller creates from it."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": template["spec"]}


def _jobs() -> list[tuple[str, dict]]:
    jobset = _load("jobset.yaml")
    return [("job.yaml", _load("job.yaml"))] + [
        (f"jobset.yaml:{r['name']}", _as_job(r["template"], r["name"])) for r in jobset["spec"]["replicatedJobs"]
    ]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("where", "job"), _jobs(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_jobs_are_valid_kubernetes_objects(where: str, job: dict, version: str) -> None:
    kubernetes_validate.validate(job, version, strict=True)


def test_a_misspelt_field_fails_the_strict_check() -> None:
    """The check above can fail: the same Job with a typo is refused."""
    job = copy.deepcopy(_load("job.yaml"))
    job["spec"]["podFailurePolicy"]["rules"][0]["onPodCondition"] = job["spec"]["podFailurePolicy"]["rules"][0].pop(
        "onPodConditions"
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[0], strict=True)


def _strict(schema: object) -> object:
    """A CRD's schema with unknown fields refused (the API server would drop them silently)."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def _jobset_validator():
    crd = yaml.safe_load(gzip.decompress(JOBSET_CRD.read_bytes()))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def test_the_jobset_is_valid_against_its_crd_schema() -> None:
    jobset = _load("jobset.yaml")
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
    validator = _jobset_validator()
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(jobset)]
    assert not errors, errors
    broken = copy.deepcopy(jobset)
    broken["spec"]["failurePolicy"]["rules"][0]["action"] = "RestartEverything"  # not one of its enum
    broken["spec"]["replicatedJobs"][0]["replica"] = 1  # misspelt
    assert len(list(validator.iter_errors(broken))) == 2


def _pod_failure_policy(job: dict) -> list[dict]:
    return job["spec"]["podFailurePolicy"]["rules"]


@pytest.mark.parametrize(("where", "job"), _jobs(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_api_servers_own_rules_for_a_pod_failure_policy(where: str, job: dict) -> None:
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # the API server refuses a podFailurePolicy otherwise
    containers = {c["name"] for c in pod["containers"]}
    for rule in _pod_failure_policy(job):
        exit_codes = rule.get("onExitCodes")
        if exit_codes:
            values = exit_codes["values"]
            assert exit_codes["containerName"] in containers
            assert values == sorted(set(values)) and 0 < len(values) <= 255  # ordered, no duplicates
            assert exit_codes["operator"] == "NotIn" or 0 not in values  # 0 cannot be used with In
        assert bool(exit_codes) != bool(rule.get("onPodConditions"))  # exactly one requirement


def _pod_failure_action(rules: list[dict], exit_code: int, conditions: tuple[str, ...] = ()) -> str:
    """What the Job controller does with a failed pod (kubernetes.io/docs, "Pod failure policy")."""
    for rule in rules:
        on_codes = rule.get("onExitCodes")
        if on_codes is not None:
            listed = exit_code in on_codes["values"]
            if exit_code != 0 and (listed if on_codes["operator"] == "In" else not listed):
                return rule["action"]
        for condition in rule.get("onPodConditions", ()):
            if condition["type"] in conditions and condition.get("status", "True") == "True":
                return rule["action"]
    return "Count"


@pytest.mark.parametrize(("where", "job"), _jobs(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_verdict_gets_the_pod_handling_the_contract_asks_for(where: str, job: dict) -> None:
    rules = _pod_failure_policy(job)
    assert _pod_failure_action(rules, 75) == "Count"  # another pod, node or time: retried
    assert _pod_failure_action(rules, 78) == "FailJob"  # needs a fix first
    assert _pod_failure_action(rules, 1) == "FailJob"  # trainguard already retried what it could
    # a preempted or evicted pod (trainguard ends 75 on the SIGTERM) does not count against backoffLimit
    assert _pod_failure_action(rules, 75, ("DisruptionTarget",)) == "Ignore"
    assert _pod_failure_action(rules, 137) == "Count"  # the container killed outright: not judged, retried
    assert job["spec"]["backoffLimit"] >= 1


def test_a_failed_job_fails_the_jobset_only_when_its_pod_failure_policy_said_so() -> None:
    """JobSet failure policy: the first rule matching the child Job's failure reason acts; none
    matching restarts the JobSet (kubernetes-sigs/jobset, KEP 262)."""
    policy = _load("jobset.yaml")["spec"]["failurePolicy"]

    def action(reason: str) -> str:
        return next((r["action"] for r in policy["rules"] if reason in r.get("onJobFailureReasons", [reason])),
                    "RestartJobSet")  # fmt: skip

    assert action("PodFailurePolicy") == "FailJobSet"  # a 78 or 1 on any node
    assert action("BackoffLimitExceeded") == "RestartJobSet"  # one node's 75s past backoffLimit
    assert policy["maxRestarts"] >= 1
    for rule in policy["rules"]:
        assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule["name"])


@pytest.mark.parametrize(("where", "job"), _jobs(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_container_runs_trainguard_in_the_foreground_with_a_grace_within_the_pods(where: str, job: dict) -> None:
    from trainguard.cli.runs import run
    from trainguard.units import parse_duration

    pod = job["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "train"]
    command = container["command"]
    assert command[:2] == ["trainguard", "run"]
    context = run.make_context("run", list(command[2:]))  # the options parse as `trainguard run` reads them
    assert context.params["foreground"] and context.params["command"]
    assert pod["terminationGracePeriodSeconds"] > parse_duration(command[command.index("--grace") + 1])
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container.get("terminationMessagePath", "/dev/termination-log") == "/dev/termination-log"
