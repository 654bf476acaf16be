# Shared by the tpr serve test scripts (sourced): a work folder $W removed on
# exit with the server $SERVER killed, and ok/FAIL lines counted in $fails.
W=$(mktemp -d "/tmp/${TEST_NAME:-tpr_serve_test}.XXXXXX")
SERVER=""
fails=0
cleanup() { [ -n "$SERVER" ] && kill -KILL "$SERVER" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
