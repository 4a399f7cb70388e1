"""The reader of the Bicep (bicep_facts.py) on small files of its own: loops over `range()`, array
for-expressions, indexes, `filter()` and `contains()`.

GIVEN a Bicep file written for one construct, parsed with pycep as the deployment's files are
WHEN  bicep_facts resolves its values with some parameters assumed
THEN  it computes what a deployment would, and leaves what it cannot know unevaluated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.infra import bicep_facts
from tests.infra.bicep_facts import Deployment, Expr, Lit, deref, resolve_symbol, truth, value_of

ENTITY = """
param entityName string
param first bool
output entityName string = entityName
"""

CHECK = """
@allowed([
  'ok'
])
param outcome string
"""

MAIN = """
param shards int = 1
param vms array = []

var base = 'maintenance-commands'
var names = [for shard in range(0, shards): (shard == 0) ? base : '${base}-${shard}']
var second = names[1]
var topics = [for vm in vms: contains(vm, 'topic') ? vm.topic : base]
var problems = filter(topics, topic => !contains(names, topic))
var withTopic = filter(vms, vm => contains(vm, 'Topic'))

module entities 'entity.bicep' = [
  for shard in range(0, shards): {
    name: 'entity-${shard}'
    params: {
      entityName: names[shard]
      first: (shard == 0)
    }
  }
]

module check 'check.bicep' = {
  name: 'check'
  params: {
    outcome: empty(problems) ? 'ok' : join(problems, ' ')
  }
}
"""


@pytest.fixture(scope="module")
def main(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bicep")
    for name, text in (("entity.bicep", ENTITY), ("check.bicep", CHECK), ("main.bicep", MAIN)):
        (folder / name).write_text(text, encoding="utf-8")
    return folder / "main.bicep"


def _value(deployment: Deployment, name: str) -> Any:
    return value_of(resolve_symbol(deployment.main, name))


def test_a_for_expression_over_range_is_the_array_it_computes(main: Path) -> None:
    # GIVEN names by shard, `(shard == 0) ? base : '${base}-${shard}'`
    deployment = Deployment(main, parameters={"shards": 3})
    # THEN each element has its index bound, in the condition and in the interpolation
    assert _value(deployment, "names") == ["maintenance-commands", "maintenance-commands-1", "maintenance-commands-2"]
    # AND an index reads one element
    assert _value(deployment, "second") == "maintenance-commands-1"
    # AND with a count nobody gave, the array is left as an expression
    assert isinstance(deref(resolve_symbol(Deployment(main).main, "names")), Expr)


def test_a_module_loop_over_range_is_one_unit_per_index(main: Path) -> None:
    # GIVEN the module declared `[for shard in range(0, shards): ...]`
    deployment = Deployment(main, parameters={"shards": 3})
    units = deployment.main.modules("entities")
    # THEN there is one unit per shard, each with its own arguments
    assert [value_of(resolve_symbol(unit, "entityName")) for unit in units] == [
        "maintenance-commands",
        "maintenance-commands-1",
        "maintenance-commands-2",
    ]
    assert [truth(unit, "first") for unit in units] == [True, False, False]
    # AND with an unknown count, one unit stands for every shard, its index a LoopRef
    [stand_in] = Deployment(main).main.modules("entities")
    assert stand_in.loop_item == "shard"
    assert truth(stand_in, "first") is None
    assert isinstance(resolve_symbol(stand_in, "entityName"), Expr)


def test_contains_reads_object_keys_without_case_and_array_elements(main: Path) -> None:
    # GIVEN VMs with and without a topic
    vms = [{"name": "web-0", "topic": "maintenance-commands-1"}, {"name": "db-1"}]
    deployment = Deployment(main, parameters={"shards": 2, "vms": vms})
    # THEN a VM's topic is read only where it has one (`contains(vm, 'topic') ? vm.topic : ...`)
    assert _value(deployment, "topics") == ["maintenance-commands-1", "maintenance-commands"]
    # AND an object's keys compare without case, as ARM's contains() does
    with_topic = resolve_symbol(deployment.main, "withTopic")
    assert isinstance(with_topic, Lit)
    assert value_of(with_topic) == [vms[0]]


def test_filter_keeps_the_elements_whose_condition_holds(main: Path) -> None:
    # GIVEN topics of which one is not a shard's
    vms = [{"name": "web-0", "topic": "maintenance-commands-7"}, {"name": "db-1", "topic": "maintenance-commands-1"}]
    refused = Deployment(main, parameters={"shards": 2, "vms": vms})
    # THEN filter() keeps that one, and the check quotes it
    assert _value(refused, "problems") == ["maintenance-commands-7"]
    assert bicep_facts.refusal(refused) == "maintenance-commands-7"
    # AND with every topic a shard's, nothing is refused
    vms[0]["topic"] = "maintenance-commands"
    assert bicep_facts.refusal(Deployment(main, parameters={"shards": 2, "vms": vms})) == ""
    # AND with VMs nobody gave, the filter is left as an expression and the check cannot be read
    unknown = Deployment(main, parameters={"shards": 2})
    assert isinstance(deref(resolve_symbol(unknown.main, "problems")), Expr)
    with pytest.raises(bicep_facts.ExtractionError, match="depends on more than is assumed"):
        bicep_facts.refusal(unknown)


def test_a_missing_property_of_a_loop_element_is_an_error_only_when_read(main: Path) -> None:
    # GIVEN a VM without a topic, read through `vm.topic` unguarded
    deployment = Deployment(main, parameters={"vms": [{"name": "db-1"}]})
    read = {"operator": {"type": "property_accessor", "operands": {"operand_1": "vm", "operand_2": "topic"}}}
    node = bicep_facts._bound(read, "vm", {"name": "db-1"})
    # THEN reading it names the element and the property
    with pytest.raises(bicep_facts.ExtractionError, match="has no topic"):
        bicep_facts.resolve(deployment.main, node)
