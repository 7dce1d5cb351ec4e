"""tools/installer.py: pip's index settings carried over to uv, and pip where uv is not wanted or not there."""

from __future__ import annotations

import sys

sys.path.insert(0, str(__import__("tests.helpers.env", fromlist=["REPO_ROOT"]).REPO_ROOT / "tools"))
import installer  # noqa: E402


def test_pip_settings_become_uv_options(tmp_path):
    local_index = tmp_path / "simple"
    local_index.mkdir()
    settings = {
        "index-url": "https://mirror.example/simple",
        "extra-index-url": f"file://{tmp_path / 'absent'} file://{local_index}",
        "find-links": "/opt/wheels /srv/more",
        "constraint": "/etc/xdg/pip/constraints.txt",
        "cert": "/etc/ssl/certs/ca.crt",
        "no-index": "false",
        "timeout": "60",  # not an index setting: not carried
    }
    options, environment = installer.uv_arguments(settings)
    assert options == [
        "--index-strategy",
        "unsafe-best-match",
        # the index pip would use comes first: uv takes a version's files from the first index that has it
        "--extra-index-url",
        "https://mirror.example/simple",
        "--index-url",
        "https://mirror.example/simple",
        "--extra-index-url",
        f"file://{local_index}",  # the absent local index is skipped, as pip skips it
        "--find-links",
        "/opt/wheels",
        "--find-links",
        "/srv/more",
        "--constraint",
        "/etc/xdg/pip/constraints.txt",
    ]
    assert environment == {"SSL_CERT_FILE": "/etc/ssl/certs/ca.crt"}
    assert installer.uv_arguments({"no-index": "1"})[0] == [
        "--index-strategy",
        "unsafe-best-match",
        "--no-index",
    ]
    assert installer.uv_arguments({})[0][2:] == [
        "--extra-index-url",
        "https://pypi.org/simple",
    ]  # pip's default


def test_pip_config_list_is_read_environment_first(tmp_path, monkeypatch):
    """The real `pip config list`: a configuration file's keys, and the environment's over them."""
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://file.example/simple\nfind-links = /from-file\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_FIND_LINKS", "/from-env")
    settings = installer.pip_settings(sys.executable)
    assert settings["index-url"] == "https://file.example/simple"
    assert settings["find-links"] == "/from-env"


def test_pip_installs_where_uv_is_not_wanted(monkeypatch):
    monkeypatch.setenv("DISTMATCH_INSTALLER", "pip")
    assert installer.ensure_uv(sys.executable) is None
    command, environment = installer.install_command("/v/bin/python", ["-q", "six"], None)
    assert (
        command == ["/v/bin/python", "-m", "pip", "install", "--no-compile", "-q", "six"]
        and environment == {}
    )


def test_uv_installs_into_the_venv_it_is_given(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_CERT", "/etc/ssl/certs/proxy-ca.crt")
    command, environment = installer.install_command(sys.executable, ["-q", "-e", "."], installer.UV)
    assert environment == {"SSL_CERT_FILE": "/etc/ssl/certs/proxy-ca.crt"}  # uv reads the certificate there
    assert command[:5] == [str(installer.UV), "pip", "install", "--python", sys.executable]
    assert command[-3:] == ["-q", "-e", "."] and "--index-strategy" in command
    assert command[command.index("--find-links") + 1] == "/opt/wheels"
