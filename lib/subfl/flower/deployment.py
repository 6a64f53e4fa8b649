"""A deployment: a SuperLink, SuperNodes and ``flwr run`` as separate processes, with TLS.

* :func:`make_certificates` — a certificate authority and a server certificate it signs (for ``127.0.0.1`` and
  ``localhost``), written as PEM files (:mod:`cryptography`);
* :func:`write_app` — a Flower app folder (``pyproject.toml``) whose components are :mod:`subfl.flower.app` and whose
  run config names one experiment (its config as JSON) and the folder the server writes the result files into;
* :func:`write_connection` — a Flower configuration (``$FLWR_HOME/config.toml``) naming the SuperLink and the CA.

Commands (``python -m subfl.flower.deployment --help``)::

    python -m subfl.flower.deployment app prism --dataset digits --scale ci --out runs/prism --app-dir app/
    flower-superlink --ssl-ca-certfile ca.pem --ssl-certfile server.pem --ssl-keyfile server.key
    flower-supernode --superlink 127.0.0.1:9092 --root-certificates ca.pem --node-config "partition-id=0 num-partitions=2"
    flwr run app/ <connection> --stream
"""
from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import sys
from pathlib import Path
from typing import Any


def make_certificates(folder: str | Path, *, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
                      days: int = 2) -> dict[str, Path]:
    """Write ``ca.pem`` (a self-signed CA), ``server.pem`` and ``server.key`` (a server certificate the CA signs for
    ``hosts``) into ``folder``; returns their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "subfl test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


def write_app(folder: str | Path, config, out_dir: str | Path, *, min_nodes: int = 1, torch_threads: int = 0,
              data_root: str | Path | None = None) -> Path:
    """A Flower app folder running ``config`` (an :class:`~subfl.experiments.ExperimentConfig`): the server writes
    the files of ``subfl run`` into ``out_dir`` (a path on the SuperLink's machine) once ``min_nodes`` SuperNodes
    are connected. ``torch_threads``: the server's and the clients' torch thread count (0: each process's own)."""
    import tomli_w

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    run_config: dict[str, Any] = {"experiment": json.dumps(config.to_dict(), sort_keys=True),
                                  "out-dir": str(Path(out_dir).absolute()), "min-nodes": int(min_nodes),
                                  "torch-threads": int(torch_threads)}
    if data_root is not None:
        run_config["data-root"] = str(data_root)
    pyproject = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": "subfl-run", "version": "1.0.0", "license": "MIT", "dependencies": [],
                    "description": f"subfl: {config.label()} on Flower"},
        "tool": {"flwr": {"app": {"publisher": "subfl",
                                  "components": {"serverapp": "subfl.flower.app:server_app",
                                                 "clientapp": "subfl.flower.app:client_app"},
                                  "config": run_config}}},
    }
    (folder / "pyproject.toml").write_text(tomli_w.dumps(pyproject), encoding="utf-8")
    return folder


def write_connection(flwr_home: str | Path, name: str, control_address: str, ca: str | Path | None) -> Path:
    """``$FLWR_HOME/config.toml`` with the SuperLink connection ``name`` (TLS with ``ca``; ``None``: insecure)."""
    import tomli_w

    home = Path(flwr_home)
    home.mkdir(parents=True, exist_ok=True)
    connection: dict[str, Any] = {"address": control_address}
    if ca is None:
        connection["insecure"] = True
    else:
        connection["root-certificates"] = str(Path(ca).absolute())
    path = home / "config.toml"
    path.write_text(tomli_w.dumps({"superlink": {"default": name, name: connection}}), encoding="utf-8")
    return path


def _overrides(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as ``subfl run`` reads them: values as JSON except for the config's string fields;
    ``method.NAME`` / ``model.NAME`` / ``dataset.NAME`` set options."""
    import dataclasses

    from ..experiments import ExperimentConfig

    strings = {f.name for f in dataclasses.fields(ExperimentConfig) if str(f.type).startswith("str")}
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        key, text = (part.strip() for part in item.split("=", 1))
        try:
            value = text if key in strings else json.loads(text)
        except json.JSONDecodeError:
            value = text
        prefix, dot, name = key.partition(".")
        if dot and prefix in ("method", "model", "dataset"):
            out.setdefault(f"{prefix}_options", {})[name] = value
        else:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    from ..experiments import make_config

    parser = argparse.ArgumentParser(prog="python -m subfl.flower.deployment", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("app", help="write a Flower app folder that runs one experiment")
    app.add_argument("method")
    app.add_argument("--dataset", required=True)
    app.add_argument("--model", default=None)
    app.add_argument("--partition", default="iid")
    app.add_argument("--scale", default="cpu")
    app.add_argument("--seed", type=int, default=0)
    app.add_argument("--set", action="append", metavar="KEY=VALUE", default=[])
    app.add_argument("--out", required=True, help="where the server writes history.csv, ledger.csv, summary.json")
    app.add_argument("--app-dir", required=True)
    app.add_argument("--min-nodes", type=int, default=1)
    app.add_argument("--torch-threads", type=int, default=0)
    certs = sub.add_parser("certificates", help="write a CA and a server certificate for 127.0.0.1 / localhost")
    certs.add_argument("folder")
    args = parser.parse_args(argv)
    if args.command == "certificates":
        for what, path in make_certificates(args.folder).items():
            print(f"{what}: {path}")
        return 0
    config = make_config(args.method, args.dataset, args.model, args.partition, scale=args.scale, seed=args.seed,
                         **_overrides(args.set))
    print(write_app(args.app_dir, config, args.out, min_nodes=args.min_nodes, torch_threads=args.torch_threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
