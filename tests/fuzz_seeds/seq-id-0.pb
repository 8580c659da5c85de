»"´
}
 €âÏªJshopRorders_]
id
bigint(20)
namevarchar(32)0utf8mb4"n01utf8mb4"n1
±
 €âÏªJshopRorders’
id
bigint(20)
namevarchar(32)0
0
utf8mb4"n00utf8mb4"n00
1
utf8mb4"n11utf8mb4"n1

 €âÏªJshopRordersa_
id
bigint(20)
namevarchar(32)
0
utf8mb4"n0
1
utf8mb4"n1