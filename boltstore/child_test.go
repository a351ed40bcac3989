package boltstore

func runChild() bool { return false }
