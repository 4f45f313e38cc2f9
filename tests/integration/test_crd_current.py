"""The start-up check that the installed CRD is as new as the operator, on a real apiserver, run by a client
that may not read the CRD (a Role of one's own, without the chart's grant on it).

Helm never upgrades a chart's crds/: on an older CRD the apiserver would prune this version's status fields from
every write, and the operator would lose them without a word. A client refused the CRD judges the schema the
apiserver publishes from it (OpenAPI v3, readable by every authenticated client), which follows the CRD after a
moment: each test waits for it to have, then checks what the operator concludes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from kubernetes.client.exceptions import ApiException
from tests.support import CRD_NAME, Cluster, token_client, wait_for

from vllm_autotuner.api.crd import stale_in_openapi
from vllm_autotuner.controller import operator
from vllm_autotuner.controller.kube import Kube
from vllm_autotuner.controller.metrics import OperatorMetrics

pytestmark = pytest.mark.integration


@pytest.fixture
def refused(cluster_with_crd: Cluster, namespace: str) -> Iterator[Kube]:
    """The operator's API calls with the token of a ServiceAccount bound to nothing: the CRD read is refused."""
    with token_client(cluster_with_crd, namespace, "default") as api:
        kube = Kube(api, OperatorMetrics())
        with pytest.raises(ApiException) as refusal:
            kube.tuning_crd()
        assert refusal.value.status == 403
        yield kube


def published(kube: Kube, stale: list[str]) -> None:
    """Wait until the schema the apiserver publishes lacks ``stale`` of this version's fields."""
    wait_for(lambda: stale_in_openapi(kube.tuning_openapi()) == stale, 60,
             f"the published VllmTuning schema to lack {stale or 'nothing'}")


def current(kube: Kube) -> bool:
    return asyncio.run(operator._crd_current(kube))


def test_the_committed_crd_is_found_current(refused: Kube, caplog: pytest.LogCaptureFixture) -> None:
    published(refused, [])
    assert current(refused)
    assert not caplog.records, caplog.text  # not taken as current for want of an answer


def test_an_older_crd_is_found_older(cluster_with_crd: Cluster, refused: Kube,
                                     caplog: pytest.LogCaptureFixture) -> None:
    crd = json.loads(cluster_with_crd.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    crd["metadata"].pop("resourceVersion")
    older = json.loads(json.dumps(crd))
    del older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["learned"]
    cluster_with_crd.kubectl("replace", "-f", "-", stdin=json.dumps(older))
    try:
        published(refused, ["status.learned"])
        assert not current(refused)
    finally:
        cluster_with_crd.kubectl("replace", "-f", "-", stdin=json.dumps(crd))
        published(refused, [])  # the session's other tests write status.learned
    assert f"the installed CRD {CRD_NAME} is older than this operator: it lacks status.learned," in caplog.text
