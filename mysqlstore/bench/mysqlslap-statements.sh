#!/bin/bash
# Statement-level comparison behind docs/benchmarks/mysqlstore.md: one-row
# claim-like statements from 16 connections into a fresh copy of the record
# table, per variant. Creates and drops the database idem_slap.
# usage: bench/mysqlslap-statements.sh [connections] [statements]
C=${1:-16}; NQ=${2:-16000}
NOW="TIMESTAMPDIFF(MICROSECOND,'1970-01-01 00:00:00',UTC_TIMESTAMP(6))"
LIT=1795990000000000
COLS="(ns, key_hash, k, state, token, nonce, fp, result, attempts, last_error, ttl_us, lease_until, expires_at, created_at, updated_at)"
ODKU="ON DUPLICATE KEY UPDATE updated_at = IF(@idem_take := ((@idem_fresh := (expires_at <= VALUES(updated_at))) OR ((state = 4 OR (state = 1 AND lease_until <= VALUES(updated_at))) AND NOT (fp <> '' AND VALUES(fp) <> '' AND fp <> VALUES(fp)))), VALUES(updated_at), updated_at), token = IF(@idem_take, NEXTVAL(s), token), nonce = IF(@idem_take, VALUES(nonce), nonce), attempts = IF(@idem_take, IF(@idem_fresh, 1, attempts + 1), attempts), fp = IF(@idem_fresh OR (@idem_take AND fp = ''), VALUES(fp), fp), result = IF(@idem_fresh, NULL, result), last_error = IF(@idem_fresh, '', last_error), created_at = IF(@idem_fresh, VALUES(created_at), created_at), ttl_us = IF(@idem_take, VALUES(ttl_us), ttl_us), lease_until = IF(@idem_take, VALUES(lease_until), lease_until), expires_at = IF(@idem_take, VALUES(expires_at), expires_at), state = IF(@idem_take, 1, state)"
RET="RETURNING k, state, token, nonce, fp, result, attempts, last_error, lease_until, expires_at, created_at, updated_at"
row() { # tok now
  echo "('bench', UNHEX(MD5(UUID())), UUID(), 1, $1, 12345, '', NULL, 1, '', 60000000, $2+60000000, $2+604800000000, $2, $2)"
}
declare -A Q
Q[A_raw]="INSERT IGNORE INTO t $COLS VALUES $(row 1 $LIT)"
Q[B_seq]="INSERT IGNORE INTO t $COLS VALUES $(row 'NEXTVAL(s)' $LIT)"
Q[C_odku]="INSERT INTO t $COLS VALUES $(row 1 $LIT) $ODKU"
Q[D_odku_ret]="INSERT INTO t $COLS VALUES $(row 1 $LIT) $ODKU $RET"
Q[E_full]="INSERT INTO t $COLS VALUES $(row 'NEXTVAL(s)' "$NOW") $ODKU $RET"
Q[F_ret_only]="INSERT IGNORE INTO t $COLS VALUES $(row 1 $LIT) $RET"
Q[G_now]="INSERT IGNORE INTO t $COLS VALUES $(row 1 "$NOW")"
for name in $(echo ${!Q[@]} | tr ' ' '\n' | sort); do
  mysql -uroot -h127.0.0.1 -e "DROP DATABASE IF EXISTS idem_slap; CREATE DATABASE idem_slap; USE idem_slap; CREATE SEQUENCE s CACHE 1000; CREATE TABLE t (ns VARBINARY(64) NOT NULL, key_hash BINARY(16) NOT NULL, k VARBINARY(1024) NOT NULL, state TINYINT UNSIGNED NOT NULL, token BIGINT UNSIGNED NOT NULL, nonce BIGINT UNSIGNED NOT NULL, fp VARBINARY(64) NOT NULL, result MEDIUMBLOB NULL, attempts INT UNSIGNED NOT NULL, last_error VARBINARY(1024) NOT NULL, ttl_us BIGINT NOT NULL, lease_until BIGINT NOT NULL, expires_at BIGINT NOT NULL, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY (ns, key_hash), KEY by_state (ns, state, expires_at)) ENGINE=InnoDB"
  s=$(date +%s.%N)
  mysqlslap -uroot -h127.0.0.1 --create-schema=idem_slap --query="${Q[$name]}" --concurrency=$C --number-of-queries=$NQ --iterations=1 --silent >/dev/null 2>${TMPDIR:-/tmp}/$name.err
  e=$(date +%s.%N)
  echo "$name $(echo "$NQ / ($e - $s)" | bc) q/s $(head -c 200 ${TMPDIR:-/tmp}/$name.err)"
done
mysql -uroot -h127.0.0.1 -e "DROP DATABASE IF EXISTS idem_slap"
