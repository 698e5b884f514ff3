"""Records shaped like the public datasets' rows (abridged), one per variant."""

from __future__ import annotations

import json
from typing import Any

# SWE-bench Verified / Lite: the test lists are JSON strings; extra columns such as difficulty.
VERIFIED: dict[str, Any] = {
    "repo": "astropy/astropy",
    "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": "diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py\n",
    "test_patch": "diff --git a/astropy/modeling/tests/test_separable.py "
    "b/astropy/modeling/tests/test_separable.py\n",
    "problem_statement": "Modeling's `separability_matrix` does not compute separability "
    "correctly for nested CompoundModels",
    "hints_text": "",
    "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3",
    "FAIL_TO_PASS": json.dumps(
        ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]
    ),
    "PASS_TO_PASS": json.dumps(
        [
            "astropy/modeling/tests/test_separable.py::test_coord_matrix",
            "astropy/modeling/tests/test_separable.py::test_cdot",
        ]
    ),
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
    "difficulty": "15 min - 1 hour",
}

# SWE-Gym: the same fields, the test lists as lists.
GYM: dict[str, Any] = {
    "instance_id": "getmoto__moto-5752",
    "repo": "getmoto/moto",
    "base_commit": "b2300f1eae1323e3e8bc45f97e530ce129dff12e",
    "patch": "diff --git a/moto/ssm/models.py b/moto/ssm/models.py\n",
    "test_patch": "diff --git a/tests/test_ssm/test_ssm_boto3.py b/tests/test_ssm/test_ssm_boto3.py\n",
    "problem_statement": "describe_parameters depends on filter order",
    "hints_text": "Thanks for raising this",
    "created_at": "2022-12-10T20:23:01Z",
    "version": "4.0",
    "FAIL_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_describe_parameters__multiple_tags"],
    "PASS_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_delete_parameter"],
    "environment_setup_commit": "b2300f1eae1323e3e8bc45f97e530ce129dff12e",
}

# SWE-smith: its own image, a swesmith/ mirror repo, no test_patch and no base_commit.
SMITH: dict[str, Any] = {
    "instance_id": "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc",
    "repo": "swesmith/oauthlib__oauthlib.1fd52536",
    "patch": "diff --git a/oauthlib/oauth1/rfc5849/signature.py "
    "b/oauthlib/oauth1/rfc5849/signature.py\n",
    "FAIL_TO_PASS": ["tests/oauth1/rfc5849/test_signatures.py::SignatureTests::test_hmac_sha1"],
    "PASS_TO_PASS": ["tests/test_common.py::CaseInsensitiveDictTest::test_basic"],
    "created_at": "2025-03-14T20:49:13.061566",
    "image_name": "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
    "problem_statement": "HMAC-SHA1 signatures no longer verify",
}
