module example.com/template

go 1.26.0

require effectively.dev v0.0.0

replace effectively.dev => ../..
