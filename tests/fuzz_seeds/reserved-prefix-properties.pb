—"

@ €âÏªJshopRordersXz"
datahub:eventTime1700000000123IG
id
bigint(20)
namevarchar(32)
200
utf8mb4"n0ˆ"

2 €âÏªJshopRordersXz

datahub:opINSERTIG
id
bigint(20)
namevarchar(32)
210
utf8mb4"n0‹"„

6 €âÏªJshopRordersXz
datahub:sequenceId42GE
id
bigint(20)
namevarchar(32)220utf8mb4"n0¡"š
—
0 €âÏªJshopRordersXz
datahub:foobarca
id
bigint(20)
namevarchar(32)4
230
utf8mb4"n0230utf8mb4"n0ì"å
â
2 €âÏªJshopRordersXz

datahub:opUPDATE«’
id
bigint(20)+
namevarchar(32)z
datahub:eventTime1M
240
utf8mb4"n0240utf8mb4"n0z
datahub:sequenceId7z

datahub:opDELETE