module catalogsync.test/pause

go 1.25.0
