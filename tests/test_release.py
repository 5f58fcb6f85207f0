"""The files a released package carries: LICENSE, CHANGELOG.md, CITATION.cff, one version, project metadata."""

from __future__ import annotations

import hashlib
import re
import sys
from importlib.metadata import metadata, version

import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

from tests.conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: MD5 of the Apache License 2.0 as the ASF publishes it (LICENSE-2.0.txt)
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def test_license_is_the_apache_2_text():
    """LICENSE is the Apache License 2.0, word for word, as pyproject declares."""
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.md5(text).hexdigest() == APACHE_2_MD5
    assert PROJECT["license"] == {"text": "Apache-2.0"}


def test_one_version_everywhere():
    """pyproject's version is the installed one, the changelog's latest release and the citation's."""
    assert version("moeopt") == PROJECT["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\]", changelog, flags=re.M)
    assert sections[0] == "Unreleased" and sections[1] == PROJECT["version"]
    assert str(yaml.safe_load((ROOT / "CITATION.cff").read_text())["version"]) == PROJECT["version"]


def test_changelog_follows_keep_a_changelog():
    """Sections newest first, each with Keep a Changelog's kinds of change only."""
    text = (ROOT / "CHANGELOG.md").read_text()
    kinds = set(re.findall(r"^### (\w+)", text, flags=re.M))
    assert kinds and kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    assert "keepachangelog.com" in text


def test_citation_file_holds_what_cff_1_2_requires():
    """CITATION.cff: CFF 1.2.0 with its required keys; the two papers the methods come from as references."""
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert cff["message"].strip() and cff["title"].strip() and cff["license"] == "Apache-2.0"
    assert cff["authors"] and all(a.get("name") or a.get("family-names") for a in cff["authors"])
    titles = [r["title"] for r in cff["references"]]
    assert any(t.startswith("Beyond Task-Agnostic") for t in titles) and any(t.startswith("GEM:") for t in titles)
    assert all(r["type"] and r["authors"] for r in cff["references"])


def test_package_metadata_has_urls_and_classifiers():
    """The installed metadata lists the project URLs and trove classifiers pyproject declares."""
    meta = metadata("moeopt")
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert set(PROJECT["urls"]) <= set(urls) or not urls  # an editable install made before the URLs has none
    assert {"Homepage", "Documentation", "Source", "Changelog", "Issues"} <= set(PROJECT["urls"])
    assert "License :: OSI Approved :: Apache Software License" in PROJECT["classifiers"]
    assert "Typing :: Typed" in PROJECT["classifiers"] and (ROOT / "moeopt" / "py.typed").exists()
