package boltoutbox

import (
	"encoding/binary"
	"fmt"

	"go.etcd.io/bbolt"
)

// BreakHeaders overwrites the stored headers of row id with bytes that do
// not decode (the row itself stays well formed).
func BreakHeaders(db *bbolt.DB, bucket, id string) error {
	return db.Update(func(tx *bbolt.Tx) error {
		root := tx.Bucket([]byte(bucket))
		v := root.Bucket(bIDs).Get([]byte(id))
		if len(v) != 8 {
			return fmt.Errorf("no row %q", id)
		}
		rows := root.Bucket(bRows)
		r, err := decodeRow(rows.Get(v))
		if err != nil {
			return err
		}
		r.headers = []byte{0xff}
		return rows.Put(u64(binary.BigEndian.Uint64(v)), r.encode())
	})
}
