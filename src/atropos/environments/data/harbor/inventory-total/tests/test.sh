#!/bin/bash
# reward.json: reward 1 when every check passes, and how many did.
cd /srv/shop
python3 -m pytest -q -p no:cacheprovider /tests/test_inventory.py -rA > /logs/verifier/pytest.txt 2>&1
status=$?
passed=$(grep -c '^PASSED' /logs/verifier/pytest.txt)
reward=0
[ "$status" -eq 0 ] && reward=1
echo "{\"reward\": $reward, \"checks_passed\": $passed}" > /logs/verifier/reward.json
cat /logs/verifier/pytest.txt
