W"Q
O
 €âÏªJdbRt2Xè42
c0
bigint(20)
z

datahub:opUPDATEÁ"º
·
 €âÏªJshopRordersX–“
id
bigint(20)
namevarchar(32)250utf8mb4"n0251utf8mb4"n10252utf8mb4"n2z

datahub:opUPDATEˆ"

2 €âÏªJshopRordersXz

datahub:opUPDATEIG
id
bigint(20)
namevarchar(32)
260
utf8mb4"n0