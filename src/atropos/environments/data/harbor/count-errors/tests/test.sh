#!/bin/bash
# Three ERROR lines in the .log files (notes.txt is not a .log file).
if [ "$(tr -d '[:space:]' < /app/errors.txt 2>/dev/null)" = "3" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
