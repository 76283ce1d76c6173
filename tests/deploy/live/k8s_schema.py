#!/usr/bin/env python3
"""The Kubernetes manifests checked field by field against the API they name.

No schema validator (kubeconform, kubeval) is packaged in Debian 12, and kubectl validates
only against a live API server. Debian does package the official Python client
(python3-kubernetes 22.6, API 1.22), whose model classes are generated from the Kubernetes
OpenAPI: each class lists its fields with their JSON names (attribute_map) and types
(openapi_types). This walks every object of every manifest against those classes: the
model is chosen by apiVersion and kind; every key must be a field of that model (a misspelt
or misplaced key fails); every value must have the field's type, recursively through lists,
maps and nested models; and the client's own deserializer then builds each object, which
fails on a required field that is missing.

--self-test breaks a copy of the first manifest's DaemonSet four ways (a misspelt key, a
string for an int, a required field removed at two depths) and fails unless each is caught.

Usage: k8s_schema.py [--self-test] MANIFEST...
"""

import copy
import os
import re
import sys
import tempfile

import yaml

try:
    import kubernetes.client as k8s
    from kubernetes.client import ApiClient
except ImportError:
    sys.exit("k8s_schema: python3-kubernetes is missing (apt install python3-kubernetes)")

SCALARS = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def model_for(api_version, kind):
    version = api_version.split("/")[-1]
    name = version[0].upper() + version[1:] + kind
    model = getattr(k8s, name, None)
    if model is None:
        raise LookupError(f"no model {name} for apiVersion {api_version}, kind {kind} in "
                          f"the Kubernetes client {k8s.__name__} (API 1.22)")
    return name, model


def check_value(value, type_name, path, errors):
    list_of = re.fullmatch(r"list\[(.+)\]", type_name)
    dict_of = re.fullmatch(r"dict\(str, (.+)\)", type_name)
    if list_of:
        if not isinstance(value, list):
            errors.append(f"{path}: a list expected ({type_name}), got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check_value(item, list_of.group(1), f"{path}[{i}]", errors)
    elif dict_of:
        if not isinstance(value, dict):
            errors.append(f"{path}: a map expected ({type_name}), got {type(value).__name__}")
            return
        for key, item in value.items():
            check_value(item, dict_of.group(1), f"{path}.{key}", errors)
    elif type_name == "object":
        # int-or-string and free-form fields: an int or a string, never a map or list.
        if isinstance(value, (dict, list)):
            errors.append(f"{path}: an int or string expected, got {type(value).__name__}")
    elif type_name in SCALARS:
        if isinstance(value, bool) and type_name != "bool" or \
                not isinstance(value, SCALARS[type_name]):
            errors.append(f"{path}: {type_name} expected, got {value!r}")
    elif type_name == "datetime":
        if not isinstance(value, str):
            errors.append(f"{path}: a timestamp string expected, got {value!r}")
    else:
        check_model(value, type_name, path, errors)


def check_model(value, model_name, path, errors):
    model = getattr(k8s, model_name)
    if not isinstance(value, dict):
        errors.append(f"{path}: an object ({model_name}) expected, got {value!r}")
        return
    by_json = {json: attr for attr, json in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json:
            errors.append(f"{path}.{key}: not a field of {model_name} (fields: "
                          f"{', '.join(sorted(by_json))})")
            continue
        check_value(item, model.openapi_types[by_json[key]], f"{path}.{key}", errors)


def check_file(path):
    errors, checked = [], []
    with open(path) as f:
        documents = [d for d in yaml.safe_load_all(f) if d is not None]
    for index, document in enumerate(documents):
        where = f"{path}#{index} ({document.get('kind')} {document.get('metadata', {}).get('name')})"
        try:
            name, _ = model_for(document["apiVersion"], document["kind"])
        except (KeyError, LookupError) as missing:
            errors.append(f"{where}: {missing}")
            continue
        before = len(errors)
        check_model(document, name, where, errors)
        if len(errors) == before:
            try:  # the client's deserializer enforces required fields
                ApiClient()._ApiClient__deserialize(document, name)
            except ValueError as invalid:
                errors.append(f"{where}: {invalid}")
        checked.append(f"{where}: {name}")
    return errors, checked


def _first(documents, kind):
    return next(d for d in documents if d.get("kind") == kind)


MUTATIONS = {
    "a misspelt key (hostPth)": lambda ds: ds["spec"]["template"]["spec"]["volumes"][0]
    .__setitem__("hostPth", ds["spec"]["template"]["spec"]["volumes"][0].pop("hostPath")),
    "a string for an int (terminationGracePeriodSeconds)": lambda ds: ds["spec"]["template"]
    ["spec"].__setitem__("terminationGracePeriodSeconds", "15"),
    "the DaemonSet's selector removed": lambda ds: ds["spec"].pop("selector"),
    "the first container's name removed": lambda ds: ds["spec"]["template"]["spec"]
    ["containers"][0].pop("name"),
}


def self_test(path):
    with open(path) as f:
        original = [d for d in yaml.safe_load_all(f) if d is not None]
    failed = False
    for what, mutate in MUTATIONS.items():
        documents = copy.deepcopy(original)
        mutate(_first(documents, "DaemonSet"))
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as broken:
            yaml.safe_dump_all(documents, broken)
        try:
            errors, _ = check_file(broken.name)
        finally:
            os.unlink(broken.name)
        print(f"self-test: {what}: " + ("caught: " + errors[0] if errors else "NOT CAUGHT"))
        failed |= not errors
    return failed


def main(argv):
    paths = [a for a in argv if a != "--self-test"]
    if not paths:
        sys.exit(__doc__)
    if "--self-test" in argv:
        return 1 if self_test(paths[0]) else 0
    failed = False
    for path in paths:
        errors, checked = check_file(path)
        for line in checked:
            print(f"checked {line}")
        for line in errors:
            print(f"ERROR {line}")
        failed |= bool(errors)
    print("k8s_schema: " + ("FAILED" if failed else "every object matches its API schema"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
