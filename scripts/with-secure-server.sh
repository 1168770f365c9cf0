#!/usr/bin/env bash
# with-secure-server.sh CMD...: like with-server.sh, but the server speaks TLS, asks for a client
# certificate (mTLS) and takes bearer tokens (AGENTRUNTIME_AUTH=tokens). It makes a throwaway CA,
# a server certificate for localhost/127.0.0.1, a client certificate and one random token with the
# read and write scopes (tenant `conformance`; only its SHA-256 goes into the tokens file), serves on
# a free loopback port (with the prices of tests/vectors/prices/prices.json unless
# AGENTRUNTIME_PRICES names another file), waits until the server answers a health check over mTLS,
# then runs CMD with
#   AGENTRUNTIME_ADDR=localhost:PORT (the name the server certificate carries)
#   AGENTRUNTIME_CA_FILE, AGENTRUNTIME_CLIENT_CERT_FILE, AGENTRUNTIME_CLIENT_KEY_FILE (PEM; the key PKCS#8)
#   AGENTRUNTIME_TOKEN
#   AGENTRUNTIME_RESTART_HOOK (a command that kills the server and starts it again, same port and store)
# and stops the server and deletes every file it made (keys and token included) when CMD ends.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
WORK=$(mktemp -d -t agentruntime-secure.XXXXXX)
chmod 700 "$WORK"
trap 'scripts/stop-server.sh "$WORK"' EXIT  # keys and token included

# The CA, the two certificates and the token (printed on stdout, never written in clear).
# The `cryptography` package is a dependency of the server (its TLS checks), so no extra is needed.
TOKEN=$("$PY" - "$WORK" <<'PYEOF'
import datetime, hashlib, ipaddress, json, os, secrets, sys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

work = sys.argv[1]
now = datetime.datetime.now(datetime.UTC)


def write(name: str, data: bytes) -> None:
    path = os.path.join(work, name)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
        file.write(data)


def certificate(subject: str, key, issuer: x509.Name, signer, *, ca: bool, usage=None, names=()) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    flags = dict.fromkeys(
        ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement", "encipher_only", "decipher_only"),
        False,
    )
    usages = x509.KeyUsage(digital_signature=not ca, key_cert_sign=ca, crl_sign=ca, **flags)
    builder = builder.add_extension(usages, critical=True)
    if not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return builder.sign(signer, hashes.SHA256())


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def pkcs8(key) -> bytes:  # PKCS#8 PEM: what Go, Node, Python and Java (Netty) all read
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


ca_key = ec.generate_private_key(ec.SECP256R1())
ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentruntime test CA")])
ca = certificate("agentruntime test CA", ca_key, ca_name, ca_key, ca=True)
server_key = ec.generate_private_key(ec.SECP256R1())
server = certificate(
    "localhost", server_key, ca_name, ca_key, ca=False, usage=ExtendedKeyUsageOID.SERVER_AUTH,
    names=(x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))),
)
client_key = ec.generate_private_key(ec.SECP256R1())
client = certificate("conformance client", client_key, ca_name, ca_key, ca=False, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
write("ca.pem", pem(ca))
write("server.pem", pem(server))
write("server.key", pkcs8(server_key))
write("client.pem", pem(client))
write("client.key", pkcs8(client_key))
token = secrets.token_urlsafe(32)
digest = hashlib.sha256(token.encode()).hexdigest()
entry = {"tenant": "conformance", "token_sha256": digest, "scopes": ["read", "write"], "name": "with-secure-server"}
write("tokens.json", json.dumps([entry], indent=2).encode())
print(token)
PYEOF
)

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$WORK/server.log
# The server's command line in a script of its own, so that the restart hook starts the same one.
{
    echo '#!/usr/bin/env bash'
    printf 'export AGENTRUNTIME_TLS_CERT=%q AGENTRUNTIME_TLS_KEY=%q AGENTRUNTIME_TLS_CLIENT_CA=%q\n' \
        "$WORK/server.pem" "$WORK/server.key" "$WORK/ca.pem"
    printf 'export AGENTRUNTIME_AUTH=tokens AGENTRUNTIME_AUTH_TOKENS_FILE=%q\n' "$WORK/tokens.json"
    # With authentication on, loopback is closed to tools: the vectors aim http tools and MCP
    # servers at 127.0.0.1:9 (nothing listens there), so the loopback range is opened.
    printf 'export AGENTRUNTIME_TOOL_EGRESS_ALLOW=%q\n' '["127.0.0.0/8", "::1/128"]'
    printf 'export AGENTRUNTIME_METRICS_LISTEN=%q\n' "${AGENTRUNTIME_METRICS_LISTEN:-off}"
    printf 'export AGENTRUNTIME_STORE=%q\n' "${AGENTRUNTIME_STORE:-sqlite:///$WORK/agentruntime.db}"
    printf 'export AGENTRUNTIME_PRICES=%q\n' "${AGENTRUNTIME_PRICES:-$PWD/tests/vectors/prices/prices.json}"
    printf 'exec %q serve --listen %q\n' "$PWD/.venv/bin/agentruntime" "127.0.0.1:$PORT"
} >"$WORK/serve.sh"
chmod 700 "$WORK/serve.sh"
"$WORK/serve.sh" >"$LOG" 2>&1 &
SERVER_PID=$!
echo "$SERVER_PID" >"$WORK/server.pid"
disown  # the restart hook may kill it: no job notice
# A vector that restarts the server mid-call runs this (tests/vectors/README.md, Restarts).
export AGENTRUNTIME_RESTART_HOOK="$PWD/scripts/restart-server.sh $WORK $PORT"

export AGENTRUNTIME_ADDR=localhost:$PORT
export AGENTRUNTIME_CA_FILE=$WORK/ca.pem
export AGENTRUNTIME_CLIENT_CERT_FILE=$WORK/client.pem
export AGENTRUNTIME_CLIENT_KEY_FILE=$WORK/client.key
export AGENTRUNTIME_TOKEN=$TOKEN

# Healthy over mTLS (the certificate's name, the CA and the client certificate all checked), and the
# token accepted by an authenticated RPC: a broken setup fails here, not in the middle of CMD.
"$PY" - "$SERVER_PID" <<'PYEOF' || { echo "---- server log ----" >&2; cat "$LOG" >&2; exit 1; }
import os, sys, time
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from agentruntime.v1 import agent_runtime_pb2 as pb, agent_runtime_pb2_grpc as pb_grpc

def read(name: str) -> bytes:
    with open(os.environ[name], "rb") as file:
        return file.read()

credentials = grpc.ssl_channel_credentials(
    read("AGENTRUNTIME_CA_FILE"), read("AGENTRUNTIME_CLIENT_KEY_FILE"), read("AGENTRUNTIME_CLIENT_CERT_FILE")
)
channel = grpc.secure_channel(os.environ["AGENTRUNTIME_ADDR"], credentials)
metadata = (("authorization", "Bearer " + os.environ["AGENTRUNTIME_TOKEN"]),)
problem = "no answer"
for _ in range(100):
    try:
        os.kill(int(sys.argv[1]), 0)
    except ProcessLookupError:
        sys.exit("the server exited")
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1, metadata=metadata)
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            pb_grpc.AgentRuntimeStub(channel).ListRuntimes(pb.ListRuntimesRequest(page_size=1), timeout=5, metadata=metadata)
            sys.exit(0)
    except grpc.RpcError as error:
        problem = f"{error.code().name}: {error.details()}"
        if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            sys.exit(f"the server refused the token: {problem}")
    time.sleep(0.1)
sys.exit(f"the server did not become healthy over TLS within 10s (last: {problem})")
PYEOF

status=0
"$@" || status=$?
if [[ $status -ne 0 ]]; then echo "---- server log ----" >&2; tail -50 "$LOG" >&2; fi
exit $status
