package pgoutbox_test

// runChild runs a child process's role when the environment asks for it;
// filled in by the process tests.
func runChild() bool { return false }
