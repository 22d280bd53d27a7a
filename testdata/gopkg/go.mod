module example.com/gopkg

go 1.22
