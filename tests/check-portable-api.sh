#!/usr/bin/env bash
# Fails when C sources use MySQL C API names that only one of the supported
# client libraries has (MariaDB Connector/C's non-blocking *_start/*_cont calls
# and mysql_optionsv; my_bool, which Oracle's libmysqlclient 8 removed).
set -u
root=${1:?usage: check-portable-api.sh SOURCE_ROOT}
cd "$root" || exit 1
hits=$(grep -rnE --include='*.c' --include='*.h' \
  '\bmysql_[a-z_]+_(start|cont)\b|\bmysql_optionsv\b|\bmy_bool\b' \
  dispatcher worker-client proto tests bench 2>/dev/null)
if [ -n "$hits" ]; then
  echo "non-portable MySQL C API use:"
  echo "$hits"
  exit 1
fi
echo "no non-portable MySQL C API names in $(find dispatcher worker-client proto tests bench -name '*.[ch]' 2>/dev/null | wc -l) C files"
