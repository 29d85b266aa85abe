module catalogsync.test/dashboard-check

go 1.26.0

require github.com/grafana/grafana-foundation-sdk/go v0.0.22
