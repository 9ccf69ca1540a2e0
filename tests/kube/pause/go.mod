module rebalancer.test/pause

go 1.24
