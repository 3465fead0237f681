#!/usr/bin/env bash
# Certificates for switchyard-webhook without cert-manager: a self-signed CA
# and a serving certificate for the webhook's Service
# (switchyard-webhook.switchyard-system.svc).
#
#   scripts/webhook-certs.sh              creates the Secret switchyard-webhook-tls
#                                         and puts the CA into the
#                                         MutatingWebhookConfiguration (kubectl)
#   scripts/webhook-certs.sh --out DIR    only writes ca.crt, tls.crt, tls.key
#
# Apply config/kubernetes/webhook.yaml first; run it again to renew (the
# webhook reloads the certificate files when the Secret changes).
set -euo pipefail
ns=switchyard-system
svc=switchyard-webhook
days=825
out=""
if [ "${1:-}" = "--out" ]; then
  out="${2:?--out needs a directory}"
  mkdir -p "$out"
fi
dir="${out:-$(mktemp -d)}"
[ -n "$out" ] || trap 'rm -rf "$dir"' EXIT

openssl req -x509 -newkey rsa:2048 -nodes -days "$days" \
  -subj "/CN=switchyard-webhook CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=$svc.$ns.svc" \
  -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
cat > "$dir/ext.cnf" <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$svc,DNS:$svc.$ns,DNS:$svc.$ns.svc,DNS:$svc.$ns.svc.cluster.local
EXT
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
  -CAcreateserial -days "$days" -extfile "$dir/ext.cnf" -out "$dir/tls.crt" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/ext.cnf" "$dir/ca.srl"

if [ -n "$out" ]; then
  rm -f "$dir/ca.key"
  echo "wrote $dir/ca.crt $dir/tls.crt $dir/tls.key"
  exit 0
fi
kubectl -n "$ns" create secret tls "$svc-tls" --cert="$dir/tls.crt" --key="$dir/tls.key" \
  --dry-run=client -o yaml | kubectl apply -f -
ca_bundle="$(base64 -w0 < "$dir/ca.crt")"
kubectl patch mutatingwebhookconfiguration switchyard-network-resources --type=json \
  -p "[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$ca_bundle\"}]"
echo "Secret $ns/$svc-tls created; caBundle set"
