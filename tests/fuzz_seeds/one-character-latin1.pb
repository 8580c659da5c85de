Ð"É
Æ
 €âÏªJshopRordersXF¥¢
id
bigint(20)
namevarchar(32)0latin1"é1latin1" 2latin1"ÿ3latin1"€4latin1"éè