£"ú
ô
 JshopRordersX
}{
id
bigint(20)
namevarchar(32)100utf8mb4"n04
101
utf8mb4"n1101utf8mb4"n1ß"†
ù
	 Ä‚œ™JshopRordersX}{
id
bigint(20)
namevarchar(32)110utf8mb4"n04
111
utf8mb4"n1111utf8mb4"n1©"¢
ü
 Ä‚œ™JshopRordersX}
id
bigint(20)
namefrobnicate(3)120utf8mb4"n04
121
utf8mb4"n1121utf8mb4"n1