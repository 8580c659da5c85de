‹"„

 €âÏªJshopRordersXa_
id
bigint(20)
namevarchar(32)10utf8mb4"n011utf8mb4"n1"†
ƒ
 €âÏªJshopRordersXca
id
bigint(20)
namefrobnicate(3)20utf8mb4"n021utf8mb4"n1‹"„

 €âÏªJshopRordersXa_
id
bigint(20)
namevarchar(32)30utf8mb4"n031utf8mb4"n1