module stepwatch.test/duration

go 1.19
