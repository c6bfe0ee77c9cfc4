"""Lookups in a synthesized cluster stack (tests/conftest.py's `synth`): the GPU node group and its
launch template, found the way CloudFormation links them, not by construct path."""

from __future__ import annotations


def gpu_nodegroup_resource(synthesized) -> tuple[str, dict]:
    """(logical id, resource) of the GPU node group."""
    name = synthesized.config.gpu_nodegroup_name
    (found,) = [
        (key, resource)
        for key, resource in synthesized.resources("cluster", "AWS::EKS::Nodegroup").items()
        if resource["Properties"]["NodegroupName"] == name
    ]
    return found


def gpu_nodegroup(synthesized) -> dict:
    return gpu_nodegroup_resource(synthesized)[1]["Properties"]


def gpu_launch_template_id(synthesized) -> str:
    return gpu_nodegroup(synthesized)["LaunchTemplate"]["Id"]["Ref"]


def launch_template_data(synthesized) -> dict:
    """The GPU launch template's LaunchTemplateData."""
    resource = synthesized.templates["cluster"]["Resources"][gpu_launch_template_id(synthesized)]
    return resource["Properties"]["LaunchTemplateData"]


def system_nodegroup(synthesized) -> dict:
    (found,) = [
        resource["Properties"]
        for resource in synthesized.resources("cluster", "AWS::EKS::Nodegroup").values()
        if resource["Properties"]["NodegroupName"] == synthesized.config.system_nodegroup_name
    ]
    return found
