#!/usr/bin/env bash
# Every manual page renders without a single warning, both through groff with all
# warnings on (-ww) and through man-db's own check (man --warnings), and has the
# sections a reader looks for first.
# Usage: render-man.sh PAGE...
set -u
status=0
for page in "$@"; do
  name=$(basename "$page")
  warn=$(LC_ALL=C.UTF-8 groff -man -ww -z -Tutf8 "$page" 2>&1
         LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)
  text=$(LC_ALL=C.UTF-8 MANWIDTH=80 MAN_KEEP_FORMATTING= man -l "$page" 2>/dev/null | col -b)
  if [ -n "$warn" ]; then
    echo "$name: warnings:"
    echo "$warn"
    status=1
    continue
  fi
  for section in NAME SYNOPSIS DESCRIPTION "SEE ALSO"; do
    [ "$name" = taskpush.7 ] && [ "$section" = SYNOPSIS ] && continue
    if ! printf '%s\n' "$text" | grep -qx "$section"; then
      echo "$name: no $section section"
      status=1
    fi
  done
  echo "$name: renders without warnings ($(printf '%s\n' "$text" | wc -l) lines)"
done
exit $status
