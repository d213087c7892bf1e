module stepwatch.test/progression

go 1.19
