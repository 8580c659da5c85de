‹"„

 €âÏªJshopRordersXa_
id
bigint(20)
namevarchar(32)10utf8mb4"n011utf8mb4"n1Š"ƒ
€
 €âÏªJshopRordersX`^
id
bigint(20)
name
varchar(x)20utf8mb4"n021utf8mb4"n1‹"„

 €âÏªJshopRordersXa_
id
bigint(20)
namevarchar(32)30utf8mb4"n031utf8mb4"n1